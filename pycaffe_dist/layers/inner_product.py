"""InnerProduct and Embed."""
