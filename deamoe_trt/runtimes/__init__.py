"""Other engines that run deamoe-trt's models: each subpackage imports its engine lazily."""
