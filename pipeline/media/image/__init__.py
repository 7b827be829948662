"""Images: container walks, strict decode, colour to 8-bit sRGB, orientation and resize."""
