"""Tiny random Hugging Face CLIP and SigLIP folders, saved offline with save_pretrained: stand-ins
for a downloaded checkpoint (nothing is downloaded). `save_clip` / `save_siglip` write what a hub
folder holds: config.json, model.safetensors, the tokenizer and the image processor, which
``AutoModel``, ``AutoTokenizer``, ``AutoImageProcessor`` and ``AutoProcessor`` load from the files alone.

The tokenizer is CLIP's own byte-level BPE with no merges: its vocabulary is the 256 byte symbols
(``bytes_to_unicode``), each also with CLIP's end-of-word mark, and the two special tokens, so any
script tokenizes (a byte a token) without a vocabulary file from anywhere. For SigLIP, whose own
tokenizer is a SentencePiece model, the same tokenizer files are saved beside the model
(SiglipProcessor takes any tokenizer AutoTokenizer loads).
"""

from __future__ import annotations

from pathlib import Path

import torch

CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
SIZE = 32


def _byte_vocab() -> dict[str, int]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbols = list(bytes_to_unicode().values())
    tokens = symbols + [s + "</w>" for s in symbols] + ["<|startoftext|>", "<|endoftext|>"]
    return {t: i for i, t in enumerate(tokens)}


def save_tokenizer(folder: Path, max_length: int) -> int:
    """CLIP's tokenizer over bytes into ``folder`` (tokenizer.json and its config); its vocabulary size."""
    from transformers import CLIPTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    vocab = _byte_vocab()
    CLIPTokenizer(vocab=vocab, merges=[], model_max_length=max_length).save_pretrained(folder)
    return len(vocab)


def _tower(**extra) -> dict:
    return dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, **extra)


def save_clip(folder: Path, seed: int = 0) -> Path:
    """A tiny random CLIPModel (ViT 32 px in patches of 8, a 2-layer text transformer, 16-d embeddings)."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    vocab = save_tokenizer(folder, max_length=32)
    config = CLIPConfig(text_config=_tower(vocab_size=vocab, max_position_embeddings=32, bos_token_id=vocab - 2,
                                           eos_token_id=vocab - 1, pad_token_id=vocab - 1),
                        vision_config=_tower(image_size=SIZE, patch_size=8), projection_dim=16)
    torch.manual_seed(seed)
    CLIPModel(config).save_pretrained(folder)
    CLIPImageProcessor(size={"shortest_edge": SIZE}, crop_size={"height": SIZE, "width": SIZE}, image_mean=CLIP_MEAN,
                       image_std=CLIP_STD).save_pretrained(folder)
    return folder


def save_siglip(folder: Path, seed: int = 0) -> Path:
    """A tiny random SiglipModel (the same sizes; 16 text positions, padded to all of them)."""
    from transformers import SiglipConfig, SiglipImageProcessor, SiglipModel

    vocab = save_tokenizer(folder, max_length=16)
    config = SiglipConfig(text_config=_tower(vocab_size=vocab, max_position_embeddings=16, bos_token_id=vocab - 2,
                                             eos_token_id=vocab - 1, pad_token_id=vocab - 1),
                          vision_config=_tower(image_size=SIZE, patch_size=8))
    torch.manual_seed(seed)
    SiglipModel(config).save_pretrained(folder)
    SiglipImageProcessor(size={"height": SIZE, "width": SIZE}).save_pretrained(folder)
    return folder
