"""The HTTP API: every Client operation as a route, with OpenAPI."""
