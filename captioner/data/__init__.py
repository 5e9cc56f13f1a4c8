"""Files on disk -> records -> batches, and the feature store; empty, so importing a module loads no pycocotools."""
