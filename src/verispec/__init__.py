"""verispec: speculative decoding whose verification can be trusted and measured."""

from .api import generate, load_engine
from .engine import GenerationResult, Metrics, SpeculativeEngine
from .processors import SamplingConfig

__all__ = ["GenerationResult", "Metrics", "SamplingConfig", "SpeculativeEngine", "generate", "load_engine"]
__version__ = "0.1.0"
