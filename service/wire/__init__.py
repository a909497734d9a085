"""The wire formats: request schemas and their array fields, JSON and safetensors in and out,
the one error shape, and the worked examples. Nothing here computes attention or knows HTTP
beyond media types."""
