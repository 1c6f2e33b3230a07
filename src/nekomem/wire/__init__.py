"""The wire shapes a layer answers in (msgspec only, below every other room): built by the
layer that answers, encoded by the route, decoded by the Python client."""
