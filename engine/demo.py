"""The built-in demo model: a tiny Qwen3 checkpoint with a trained byte-level BPE tokenizer and
weights trained for a few seconds on the same corpus (demo_train.py), generated offline,
byte-for-byte deterministic for a given seed.

It is what `radixserve serve --model demo` runs and what the parity tests build on
(docs/reliability.md #25). Greedy output is made of the corpus' words and phrases and still varies
with the prompt; `tests/test_demo.py` asserts both with transformers as the judge.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from radixserve.engine.demo_corpus import CORPUS
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

if TYPE_CHECKING:
    import torch

# Bump whenever the corpus, the tokenizer recipe, the config, the weight init or the training
# changes: the cached copy lives under a versioned folder name, so an old cache is never mistaken
# for the new model.
DEMO_VERSION = "2"
DEMO_VOCAB_SIZE = 1024
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)  # ids 0, 1, 2: the trainer puts them first

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class DemoArch:
    """Sizes of the demo model, under HF config names; vocab_size comes from the tokenizer."""

    hidden_size: int = 128
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 256
    max_position_embeddings: int = 4096
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6

    def to_config(self) -> dict[str, int | float]:
        return dataclasses.asdict(self)


DEMO_ARCH = DemoArch()

# Init scales. With the usual std=0.02 a tied tiny model keeps predicting its input token (the
# residual stream is mostly the input embedding, and the tied head maps it straight back). Unit
# embeddings and linear layers at 3/sqrt(fan_in) let attention and MLP outweigh that, which makes
# greedy output wander; norm weights and biases are jittered so a loader that drops them is caught.
# The random test checkpoints (tests/checkpoints.py) use them as they are; the demo trains from a
# scaled-down copy (demo_train.INIT_SCALE).
EMBED_STD = 1.0
LINEAR_GAIN = 3.0
NORM_JITTER = 0.1
BIAS_STD = 0.1


@functools.cache
def _trained_tokenizer_json() -> str:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=DEMO_VOCAB_SIZE,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        # All 256 byte symbols up front: any text encodes, whatever the corpus lacks.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.splitlines(keepends=True), trainer=trainer)
    return tok.to_str()


def train_tokenizer() -> Tokenizer:
    """The demo tokenizer (a fresh object each call; the training itself runs once per process)."""
    return Tokenizer.from_str(_trained_tokenizer_json())


def save_tokenizer(path: str | Path) -> Tokenizer:
    """Write tokenizer.json + tokenizer_config.json into `path` so that
    `transformers.AutoTokenizer.from_pretrained(path)` and `tokenizers.Tokenizer.from_file` both
    load it offline. Returns the tokenizer, whose `get_vocab_size()` is the model's vocab size."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer()
    (path / "tokenizer.json").write_text(_trained_tokenizer_json(), encoding="utf-8")
    config = {
        # The generic fast class only wraps tokenizer.json; a model-specific class could rebuild
        # the pre-tokenizer its own way and disagree with what we trained.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": DEMO_ARCH.max_position_embeddings,
        "chat_template": CHAT_TEMPLATE,
    }
    _write_json(path / "tokenizer_config.json", config)
    return tok


def special_token_ids(tok: Tokenizer) -> dict[str, int]:
    ids = {name: tok.token_to_id(name) for name in SPECIAL_TOKENS}
    missing = [name for name, i in ids.items() if i is None]
    assert not missing, f"special tokens missing from the vocabulary: {missing}"
    return {name: i for name, i in ids.items() if i is not None}


def init_weight(name: str, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """A float32 tensor for parameter `name` (HF dotted name), drawn from `generator`."""
    import torch

    noise = torch.randn(shape, generator=generator, dtype=torch.float32)
    if name.endswith("norm.weight"):
        return 1.0 + NORM_JITTER * noise
    if name.endswith(".bias"):
        return BIAS_STD * noise
    if "embed_tokens" in name or name == "lm_head.weight":
        return EMBED_STD * noise
    assert len(shape) == 2, f"unexpected parameter {name} {shape}"
    return (LINEAR_GAIN / shape[1] ** 0.5) * noise  # nn.Linear weight: (out, in)


def qwen3_param_shapes(vocab_size: int) -> dict[str, tuple[int, ...]]:
    """HF Qwen3ForCausalLM parameter names and shapes for the demo sizes (tied: no lm_head)."""
    a = DEMO_ARCH
    hidden, head_dim, inter = a.hidden_size, a.head_dim, a.intermediate_size
    q_dim, kv_dim = a.num_attention_heads * head_dim, a.num_key_value_heads * head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab_size, hidden),
        "model.norm.weight": (hidden,),
    }
    for i in range(a.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
            p + "self_attn.q_proj.weight": (q_dim, hidden),
            p + "self_attn.k_proj.weight": (kv_dim, hidden),
            p + "self_attn.v_proj.weight": (kv_dim, hidden),
            p + "self_attn.o_proj.weight": (hidden, q_dim),
            p + "self_attn.q_norm.weight": (head_dim,),
            p + "self_attn.k_norm.weight": (head_dim,),
            p + "mlp.gate_proj.weight": (inter, hidden),
            p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
        }
    return shapes


def create_demo_model(path: str | Path, *, seed: int = 0) -> Path:
    """Write the demo checkpoint (config, generation config, safetensors, tokenizer) into `path`,
    creating it if needed, and return it. Same seed, same bytes."""
    # torch is imported here, not at the top: services that only resolve the cached path (the
    # tokenizer and detokenizer) must not pay for loading it.
    import torch
    from safetensors.torch import save_file

    path = Path(path)
    tok = save_tokenizer(path)
    ids = special_token_ids(tok)
    vocab_size = tok.get_vocab_size()
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab_size,
        **DEMO_ARCH.to_config(),
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "rope_scaling": None,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": DEMO_ARCH.num_hidden_layers,
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "bos_token_id": ids[ENDOFTEXT],
        "eos_token_id": ids[IM_END],
        "use_cache": True,
    }
    _write_json(path / "config.json", config)
    generation = {
        "bos_token_id": ids[ENDOFTEXT],
        "eos_token_id": [ids[IM_END], ids[ENDOFTEXT]],
        "pad_token_id": ids[ENDOFTEXT],
        "do_sample": False,
    }
    _write_json(path / "generation_config.json", generation)
    gen = torch.Generator().manual_seed(seed)
    # Sorted names fix the draw order, so the bytes depend only on the seed.
    tensors = {
        name: init_weight(name, shape, gen)
        for name, shape in sorted(qwen3_param_shapes(vocab_size).items())
    }
    # Imported here, not at the top: demo_train imports this module's sizes.
    from radixserve.engine.demo_train import train_weights

    train_weights(tensors, tok.encode(CORPUS).ids, seed=seed)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    _make_world_readable(path)
    return path


def cache_root() -> Path:
    """`$RADIXSERVE_CACHE`, else `$XDG_CACHE_HOME/radixserve`, else `~/.cache/radixserve`."""
    explicit = os.environ.get("RADIXSERVE_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "radixserve"


def demo_model_path() -> Path:
    """The cached demo model (seed 0), created on first use.

    Safe when several processes start together: each builds into its own hidden temp folder and
    renames it into place. rename(2) of a folder is atomic and fails if the target already holds
    files, so the folder at the final name is always complete and a loser simply discards its copy.
    """
    root = cache_root()
    final = root / f"demo-v{DEMO_VERSION}"
    if (final / "config.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
    try:
        create_demo_model(tmp)  # also undoes mkdtemp's owner-only mode: the cache may be shared
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "config.json").is_file():
                raise  # not a lost race: a real failure (permissions, a stray file at `final`)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already if the rename won
    return final


def _make_world_readable(path: Path) -> None:
    """Folder 0755, files 0644, whatever the umask or the writer chose: safetensors' save_file
    creates its file 0600, and a model built by root (an image build) is served by another user."""
    path.chmod(0o755)
    for child in path.iterdir():
        child.chmod(0o755 if child.is_dir() else 0o644)


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")
