"""Engine configuration: one frozen dataclass, validated once, forked per TP rank with `replace`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from radixserve.engine.constrained.compiler import (
    DEFAULT_COMPILE_TIMEOUT_S,
    DEFAULT_MAX_CONSTRAINT_BYTES,
)
from radixserve.engine.sampling.params import MAX_CONSTRAINT_CHARS
from radixserve.engine.scheduler.prefill_budget import BudgetUnit

CacheKind = Literal["radix", "naive"]
SchedulePolicy = Literal["fcfs", "lpm"]
AdmissionPolicy = Literal["reserve", "optimistic"]
LoadFormat = Literal["auto", "dummy"]
ControlKind = Literal["auto", "shm", "gloo"]
DTYPES = ("auto", "float32", "bfloat16", "float16")
EAGER_PREFILL_ADMISSION_WAIT_MS = 50.0
GRAPHED_MIXED_STEP_RATIO = 1.5


@dataclass(frozen=True)
class EngineConfig:
    model_path: str
    # "auto" resolves to cuda when available, else cpu (resolved by the caller)
    device: str = "auto"
    dtype: str = "auto"  # "auto": the checkpoint's dtype on GPU, float32 on CPU
    page_size: int = 16
    max_prefill_tokens: int = 4096  # per-step budget for prefill chunks
    # What that budget counts: "tokens", or "compute", where a token also pays for the keys it
    # attends to, so that chunks deep into a long prompt are shorter (scheduler/prefill_budget.py)
    prefill_budget: BudgetUnit = "tokens"
    # The budget of a step that also decodes (None: max_prefill_tokens), counted the same way.
    # Such a step is a gap in every decoding stream, so a smaller budget bounds those gaps while
    # prompts arrive, and a prompt past it is chunked over several steps (its first token comes
    # later).
    mixed_prefill_tokens: int | None = None
    # A step that decodes takes prefill only up to what keeps it within this many decode steps'
    # time, as the engine measures its own steps (scheduler/step_cost.py), unless the prefill
    # waiting would then take more than a few steps to enter (a burst is not queued behind it):
    # the gap that an admission makes in every decoding stream stays near this multiple of the
    # usual one. None: GRAPHED_MIXED_STEP_RATIO where piecewise CUDA graphs run such steps, 0
    # elsewhere (an eager step's fixed host cost is better paid once); 0: off.
    mixed_step_ratio: float | None = None
    # Under mixed_step_ratio, the prefill waiting (the running prompts' rest and the prompts the
    # free slots can take) still enters within this many steps: a step that decodes takes what
    # exceeds what the capped steps after it could, so a burst, or an offline queue, is not held
    # behind the cap. Fewer: bursts enter sooner, in longer gaps; more: gaps nearer the ratio,
    # first tokens later in a burst.
    mixed_horizon_steps: int = 8
    # Where mixed_step_ratio is on, a prompt too long for one step, beside decoding streams, is
    # cut into chunks smaller than the step's budget, as small as keeps its prefill within this
    # share of the time its largest chunks would take (0.3: up to 30 % longer), so the gaps it
    # makes in every stream are shorter (scheduler/step_cost.py). On an H200 with Qwen3-8B and
    # 2,048-token steps, 0.3 brought the streams' inter-token p99 beside 16k-token prompts from 81
    # to 47 ms for 20 % more time to their first token (docs/benchmarks.md). 0: off, its chunks
    # fill the budget.
    long_prompt_slack: float = 0.3
    max_running_requests: int = 64  # request slots
    max_queued_requests: int = 1024
    num_pages: int | None = None  # None: sized from memory (GPU) or a fixed token budget (CPU)
    max_context: int | None = None  # None: the model's max_position_embeddings
    cache: CacheKind = "radix"
    overlap: bool = True
    attention_backend: str = "auto"
    schedule_policy: SchedulePolicy = "fcfs"
    # "optimistic": admit on prompt + an estimated share of the output, retract under KV pressure
    # (outputs unchanged); "reserve": reserve pages for max_new_tokens up front
    # (see scheduler/admission.py)
    admission: AdmissionPolicy = "optimistic"
    # While at least a quarter of the slots decode, a new request may wait up to this long so that
    # arrivals are admitted together: one step that carries prefill for several arrivals costs less
    # than one each where such steps run eagerly (docs/benchmarks.md, "Serving plane"). None: 0
    # where piecewise CUDA graphs run them, EAGER_PREFILL_ADMISSION_WAIT_MS where they run eagerly
    # (CPU, piecewise graphs off); 0 admits at once
    # (scheduler/scheduler.py, `_admission_due`).
    admission_wait_ms: float | None = None
    tp_size: int = 1
    tp_rank: int = 0
    tp_timeout_s: float = 300.0  # a TP collective slower than this means a rank died or hung
    # The communicator the layers use at tp_size > 1, by name (engine/distributed/__init__.py).
    tp_comm: str = "torch"
    # How rank 0 sends each step's plan to the other ranks (engine/tp/channel.py): "shm", a
    # shared-memory ring ("auto": every rank runs on this host), or "gloo" broadcasts.
    tp_control: ControlKind = "auto"
    seed: int = 0
    memory_fraction: float = 0.85  # share of free GPU memory the KV pool may take
    cpu_kv_tokens: int = 65536  # KV capacity in tokens when num_pages is None on CPU
    cuda_graph: bool = True
    cuda_graph_max_batch: int = 256
    # Steps with prefill tokens also replay the decode graphs, each new token a decode row of its
    # own, where those tokens attend to at most this many keys in all (a token at position p
    # attends to p + 1: 16,384 keys are a prompt of 180 tokens from position 0) and the step has
    # at most cuda_graph_max_batch tokens. The decode kernel reads a prompt row's keys as it reads
    # a running request's, about 23 ns a key on an H200 for Qwen3-0.6B, which past ~20k keys costs
    # more than the host work it saves (docs/benchmarks.md, "GPU, tenth round"). 0: off (such
    # steps run the piecewise graphs, or eagerly).
    graph_prefill_keys: int = 16384
    # Decode graphs of up to this many rows run the attention of attention/small_decode.py (Triton,
    # its KV split from each row's length: on the device up to 32 rows, past 2,048 keys from the
    # graph's plan above) where the backend is flashinfer; larger ones FlashInfer's decode kernel.
    # 0: FlashInfer's always. On an H200 the offline workload ran 5 % faster on Qwen3-0.6B and
    # 21 % on Qwen3-8B at 256 than at 32 (docs/benchmarks.md, "GPU, seventeenth round").
    small_decode_rows: int = 256
    # True: the step's Triton kernels (norms, rotary, the small-batch GEMV and decode attention)
    # start while the kernel before them finishes, by programmatic dependent launch, on GPUs that
    # have it (compute 9.0+; engine/pdl.py). False: each waits for the whole kernel before it.
    pdl: bool = True
    # Steps with prefill tokens of up to this many tokens replay piecewise CUDA graphs
    # (piecewise_graph.py). None: max_prefill_tokens + max_running_requests on CUDA with graphs on,
    # off on CPU; 0: off; a number on CPU runs the same pieces uncaptured (tests).
    piecewise_graph_max_tokens: int | None = None
    # Steps that decode beside prefill rows whose requests attend to at most this many keys run
    # their prefill attention inside the piecewise graphs too (attention/paged_prefill.py, beside
    # the small decode kernel): the whole forward is one graph replay, no call between the pieces.
    # Longer contexts stay between the pieces (FlashInfer). 0: off. Served on H100s (Qwen3-0.6B
    # near their maximum rate) it cut the engine thread's p99 launch in each of five on/off
    # pairs, at the same TPOT and throughput, though its kernel is 1.2-1.7x FlashInfer's device
    # time on Qwen3-0.6B and 1.6-2.1x on Qwen3-8B (docs/benchmarks.md, "GPU, thirty-sixth
    # round").
    piece_prefill_keys: int = 4096
    # Steps that carry decodes and prefill run the decode rows through the decode kernel
    # (attention/mixed.py) with the backends that can; False: one prefill kernel for the whole step.
    split_mixed_attention: bool = True
    load_format: LoadFormat = "auto"  # "dummy": random weights from config.json alone (benchmarks)
    # Structured output: a constraint text longer than this (UTF-8 bytes) is refused, and so is
    # one whose grammar takes longer than this to compile (the compile runs in a worker process,
    # killed at the limit; engine/constrained/workers.py).
    max_constraint_bytes: int = DEFAULT_MAX_CONSTRAINT_BYTES
    grammar_compile_timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")
        if self.max_prefill_tokens < self.page_size:
            raise ValueError("max_prefill_tokens must be at least page_size")
        if self.mixed_prefill_tokens is not None and self.mixed_prefill_tokens < 1:
            raise ValueError(f"mixed_prefill_tokens must be >= 1, got {self.mixed_prefill_tokens}")
        if self.mixed_step_ratio is not None and not (self.mixed_step_ratio == 0
                                                      or 1 < self.mixed_step_ratio < math.inf):
            raise ValueError("mixed_step_ratio must be 0 (off) or a number above 1, got "
                             f"{self.mixed_step_ratio}")
        if self.mixed_horizon_steps < 1:
            raise ValueError(f"mixed_horizon_steps must be >= 1, got {self.mixed_horizon_steps}")
        if not 0 <= self.long_prompt_slack < math.inf:
            raise ValueError("long_prompt_slack must be 0 (off) or more, got "
                             f"{self.long_prompt_slack}")
        if self.max_running_requests < 1:
            raise ValueError("max_running_requests must be >= 1")
        if self.num_pages is not None and self.num_pages < 2:
            raise ValueError("num_pages must be >= 2")
        if self.prefill_budget not in ("tokens", "compute"):
            raise ValueError("prefill_budget must be 'tokens' or 'compute', got "
                             f"{self.prefill_budget!r}")
        if self.cache not in ("radix", "naive"):
            raise ValueError(f"cache must be 'radix' or 'naive', got {self.cache!r}")
        if self.load_format not in ("auto", "dummy"):
            raise ValueError(f"load_format must be 'auto' or 'dummy', got {self.load_format!r}")
        if self.cuda_graph_max_batch < 1:
            raise ValueError("cuda_graph_max_batch must be >= 1")
        if self.small_decode_rows < 0:
            raise ValueError(f"small_decode_rows must be >= 0, got {self.small_decode_rows}")
        if self.graph_prefill_keys < 0:
            raise ValueError(f"graph_prefill_keys must be >= 0, got {self.graph_prefill_keys}")
        if self.piece_prefill_keys < 0:
            raise ValueError(f"piece_prefill_keys must be >= 0, got {self.piece_prefill_keys}")
        if self.piecewise_graph_max_tokens is not None and self.piecewise_graph_max_tokens < 0:
            raise ValueError("piecewise_graph_max_tokens must be >= 0")
        if self.schedule_policy not in ("fcfs", "lpm"):
            raise ValueError("schedule_policy must be 'fcfs' or 'lpm', got "
                             f"{self.schedule_policy!r}")
        if self.admission not in ("reserve", "optimistic"):
            raise ValueError(f"admission must be 'reserve' or 'optimistic', got {self.admission!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"tp_rank {self.tp_rank} out of range for tp_size {self.tp_size}")
        if self.tp_control not in ("auto", "shm", "gloo"):
            raise ValueError(f"tp_control must be 'auto', 'shm' or 'gloo', got {self.tp_control!r}")
        if not self.tp_timeout_s > 0:
            raise ValueError(f"tp_timeout_s must be > 0, got {self.tp_timeout_s}")
        if self.admission_wait_ms is not None and not self.admission_wait_ms >= 0:
            raise ValueError(f"admission_wait_ms must be >= 0, got {self.admission_wait_ms}")
        if not 0 < self.memory_fraction <= 1:
            raise ValueError("memory_fraction must be in (0, 1]")
        if not 0 < self.max_constraint_bytes <= MAX_CONSTRAINT_CHARS:
            raise ValueError(f"max_constraint_bytes must be in (0, {MAX_CONSTRAINT_CHARS}], got "
                             f"{self.max_constraint_bytes}")
        if not 0 < self.grammar_compile_timeout_s < math.inf:
            raise ValueError("grammar_compile_timeout_s must be a positive number of seconds, got "
                             f"{self.grammar_compile_timeout_s}")
