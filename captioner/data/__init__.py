"""Files on disk -> records -> batches, and the feature store. Empty: importing a module loads no pycocotools."""
