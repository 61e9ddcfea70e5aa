"""Make a tiny, randomly initialised Llama checkpoint (and an EAGLE draft) for CPU runs.

No hub download exists here, so the tests and the demo build their own model: a 2-layer
``LlamaForCausalLM`` (hidden 64, vocab 512, bf16) with a byte-level BPE tokenizer trained in
memory, and optionally a ``LlamaForCausalLMEagle`` draft (one decoder layer + ``fc``).

    python scripts/make_tiny_model.py OUT_DIR [--draft DRAFT_DIR]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

VOCAB = 512
HIDDEN = 64
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "SGLang serves large language models with tensor parallelism.",
    "Every rank loads its shard of the weights, then captures graphs.",
    "Hello world! 0123456789 ,.;:?!'\"()[]{}<>/\\|@#$%^&*-_=+~`",
] * 50


def _config(layers: int) -> dict:
    return dict(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        torch_dtype="bfloat16",
    )


def make_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.save_pretrained(out)


def make_target(out: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**_config(2))).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    make_tokenizer(out)


def make_draft(out: Path) -> None:
    """EAGLE draft layout: names without the ``model.`` prefix, one layer, ``fc`` over 2 x hidden."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    layer = LlamaForCausalLM(LlamaConfig(**_config(1))).to(torch.bfloat16)
    tensors = {
        k.removeprefix("model."): v.contiguous()
        for k, v in layer.state_dict().items()
        if not k.startswith("model.norm") and "input_layernorm" not in k
    }
    tensors["fc.weight"] = torch.randn(HIDDEN, 2 * HIDDEN, dtype=torch.bfloat16) * 0.02
    tensors["fc.bias"] = torch.zeros(HIDDEN, dtype=torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = dict(_config(1), architectures=["LlamaForCausalLMEagle"], model_type="llama")
    (out / "config.json").write_text(json.dumps(config, indent=2))
    make_tokenizer(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory for the target model")
    parser.add_argument("--draft", type=Path, help="also write an EAGLE draft model here")
    args = parser.parse_args(argv)
    if not (args.out / "config.json").exists():
        make_target(args.out)
    if args.draft and not (args.draft / "config.json").exists():
        make_draft(args.draft)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
