"""specroute: route OpenAI requests across SGLang or vLLM backends by speculative depth and load."""

__version__ = "0.1.0"
__all__ = ["__version__"]
