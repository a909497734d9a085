"""The wire formats (service/wire): JSON and safetensors in and out, odd input."""
