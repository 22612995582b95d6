//! Dioxus UI (being written).
