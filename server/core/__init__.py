"""The generation core shared by every API: transcript -> prompt -> engine -> events."""
