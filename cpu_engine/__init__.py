"""CPU LLM engine: model, slotted KV cache, in-flight batching scheduler and sampling."""

from .admission import QueueFullError
from .engine import EngineLimits, LLMEngine, TokenEvent
from .engine_dir import LoadedEngine, load_engine, read_config
from .sampling import SamplingParams
from .scheduler import FinishReason, GenerationRequest

__all__ = ["EngineLimits", "FinishReason", "GenerationRequest", "LLMEngine", "LoadedEngine", "QueueFullError",
           "SamplingParams", "TokenEvent", "load_engine", "read_config"]
