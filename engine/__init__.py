"""radixserve's engine: `from radixserve.engine import LLM, SamplingParams`."""

from radixserve.engine.sampling.params import InvalidRequestError, SamplingParams


def __getattr__(name: str):  # LLM pulls in torch and transformers: import it on first use
    if name == "LLM":
        from radixserve.engine.llm import LLM

        return LLM
    raise AttributeError(name)


__all__ = ["LLM", "SamplingParams", "InvalidRequestError"]
