"""Loss layers and Accuracy."""
