"""The tiny base model of the offline kit: a deterministic Llama and its tokenizer, on CPU.

Nothing can be downloaded here, so tests, the demo and the benchmarks build their base:

* ``build_base``: a deterministic tiny Llama (hidden 128, 2 heads of dim 64 -- vLLM's CPU
  attention rejects head_dim 16 -- 2 layers) with a byte-level BPE tokenizer trained in
  memory on the toy tenant tasks (``kit.tenant_tasks``). Variants change RoPE scaling or
  the layer count, keeping everything else.
* ``base_commit``: the commit a local base is pinned at.
* ``write_hf_cache``: lays a base out as a Hugging Face hub cache snapshot.

The adapters trained on it are ``kit.modelkit``'s.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from kit.tenant_tasks import TASKS, prompt_for

BASE_ID = "tiny-llama"
# the tokenizer is trained on these tasks only, so every base stays byte-identical when
# a task is added
_TOKENIZER_TASKS = ("support", "tickets")


def _tokenizer_corpus() -> list[str]:
    texts = []
    for task in _TOKENIZER_TASKS:
        for ex in TASKS[task]["examples"]:
            texts.append(prompt_for(task, ex.query) + " " + ex.reply)
    filler = "the quick brown fox jumps over the lazy dog while five wizards box 0123456789 {}[]:,\"'"
    return texts * 4 + [filler] * 8


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tokenizer_corpus(), trainer)
    # prepend BOS the same way for transformers and vLLM (add_special_tokens=True)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", padding_side="left"
    )


def build_base(dest: Path, *, rope_scaling: dict[str, Any] | None = None, num_layers: int = 2, seed: int = 0) -> Path:
    """Write a deterministic tiny Llama to ``dest`` (same seed, same bytes)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    tokenizer = build_tokenizer()
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    if rope_scaling:
        rope = {**rope, **rope_scaling}
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=num_layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        rope_parameters=rope,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        # a sharper random base: greedy decoding of the bare base is far from any reply
        model.lm_head.weight.mul_(4.0)
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    return dest


def base_commit(base_dir: Path) -> str:
    """The commit a local base is pinned at: the content digest of its directory."""
    from loragate.registry.intake.catalog import directory_digest

    return directory_digest(Path(base_dir))


def write_hf_cache(base_dir: Path, cache_root: Path, repo_id: str, commit: str) -> Path:
    """Lay ``base_dir`` out as the hub cache snapshot ``repo_id@commit`` under ``cache_root``
    (the ``hub`` folder of HF_HOME), the way huggingface_hub stores downloads."""
    repo = Path(cache_root) / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    for f in Path(base_dir).iterdir():
        if f.is_file():
            shutil.copyfile(f, snapshot / f.name)
    return snapshot
