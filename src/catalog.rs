//! Model catalog, fetch and quantize (being written).
