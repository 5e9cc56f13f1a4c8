"""Files on disk -> records -> batches: images, the datasets (shapes, COCO, Karpathy splits,
Flickr8k), batching and sampling, and the fp16 feature store. Nothing is imported here, so
`import captioner.data.image_transform` does not load pycocotools."""
