//! Fast quantized linear layers (being written).
