"""LoRA adapters on a Hugging Face policy, built with peft (``policy.lora``).

LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", eq. 3) freezes
each target weight ``W0 [out, in]`` and trains ``A [r, in]`` and ``B [out, r]`` (``B`` starts
at zero), so the layer computes ``W0 x + (alpha / r) B A x``. What leaves the worker for the
generation engine is the merged weight ``W0 + (alpha / r) B A`` under the base model's
Hugging Face names: the engine needs no LoRA support, and refit, the probe and the final
export are the same as for full fine-tuning.

The base weights never change, so the base model with its adapters switched off *is* the
frozen reference policy; no second copy is kept.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from posttrain.config import LoraConfig
from posttrain.errors import ConfigError

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def apply_lora(model: torch.nn.Module, cfg: LoraConfig) -> Any:
    """Wrap ``model`` in a peft ``PeftModel`` with one LoRA adapter; only the adapter trains.

    Args:
        model: a Hugging Face causal LM (fp32).
        cfg: the ``policy.lora`` section: ``rank`` (> 0), ``alpha``, ``dropout``,
            ``target_modules`` (module names, e.g. ``q_proj``).

    Raises:
        ConfigError: a target module the model does not have.
    """
    import peft

    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = sorted(set(cfg.target_modules) - names)
    if missing:
        raise ConfigError(f"policy.lora.target_modules: {', '.join(missing)} not in the model "
                          f"(its linear layers: {', '.join(sorted(_linear_names(model)))})")
    # peft annotates lora_alpha as int but scales by alpha / r in float: 1.5 works as meant
    lora = peft.LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,  # type: ignore[arg-type]
                           target_modules=list(cfg.target_modules), bias="none")
    return peft.get_peft_model(model, lora)


def _linear_names(model: torch.nn.Module) -> set[str]:
    return {name.rsplit(".", 1)[-1] for name, mod in model.named_modules() if isinstance(mod, torch.nn.Linear)}


@torch.no_grad()
def merged_state_dict(peft_model: Any) -> dict[str, torch.Tensor]:
    """The weights the adapted model computes with, as a plain model's state dict: Hugging
    Face names of the base model, each LoRA target's weight ``W0 + (alpha / r) B A``, detached
    CPU tensors in the base weights' dtype. ``peft_model`` itself is left untouched (merging in
    place and unmerging would move the frozen base weights by float rounding at every call)."""
    from peft.tuners.lora import LoraLayer

    base = peft_model.get_base_model()
    layers: dict[str, Any] = {name: m for name, m in base.named_modules() if isinstance(m, LoraLayer)}
    deltas = {f"{name}.weight": m.get_delta_weight(m.active_adapters[0]) for name, m in layers.items()}
    out: dict[str, torch.Tensor] = {}
    for name, tensor in base.state_dict().items():
        if ".lora_" in name:
            continue
        name = name.replace(".base_layer.", ".")
        value = tensor + deltas[name] if name in deltas else tensor
        out[name] = value.detach().cpu().clone()
    return out


def check_adapter(path: Path, cfg: LoraConfig) -> None:
    """Refuse to load checkpoint ``path`` into a policy whose ``policy.lora`` section is ``cfg``.

    Raises:
        ConfigError: ``path`` has an adapter and ``cfg.rank`` is 0; it has none (a full
            fine-tuning checkpoint) and ``cfg.rank`` > 0; or its rank, alpha or target modules
            differ from ``cfg``.
    """
    if cfg.rank == 0:
        if (path / ADAPTER_CONFIG).is_file():
            raise ConfigError(f"checkpoint '{path}' holds a LoRA adapter, but policy.lora.rank=0")
        return
    if not (path / ADAPTER_CONFIG).is_file():
        raise ConfigError(f"checkpoint '{path}' holds no LoRA adapter (was it written with policy.lora.rank=0?)")
    saved = json.loads((path / ADAPTER_CONFIG).read_text())
    pairs = {"rank": (saved["r"], cfg.rank), "alpha": (saved["lora_alpha"], cfg.alpha),
             "target_modules": (sorted(saved["target_modules"]), sorted(cfg.target_modules))}
    for key, (was, now) in pairs.items():
        if was != now:
            raise ConfigError(f"checkpoint '{path}' has policy.lora.{key}={was}, the config says {now}")


def check_adapter_tensors(path: Path, missing: list[str], unexpected: list[str]) -> None:
    """Refuse an adapter checkpoint that does not hold exactly the policy's adapter tensors.

    ``missing`` and ``unexpected`` are what peft's ``set_peft_model_state_dict`` reports. Its missing
    keys list every base weight too (a checkpoint holds the adapter only), so only missing adapter
    tensors (``.lora_``) count: one of those would silently keep its fresh initialization (A random,
    B zero) in a run that reports it resumed.

    Raises:
        ConfigError: an adapter tensor missing, or a tensor the policy's adapters do not have;
            one line naming the checkpoint and the first three.
    """
    lost = [key for key in missing if ".lora_" in key]
    if lost:
        raise ConfigError(f"checkpoint '{path}': its adapter lacks {len(lost)} of the policy's adapter tensors "
                          f"({', '.join(lost[:3])}{', ...' if len(lost) > 3 else ''})")
    if unexpected:
        raise ConfigError(f"checkpoint '{path}': its adapter has {len(unexpected)} tensors the policy's adapters "
                          f"do not ({', '.join(unexpected[:3])}{', ...' if len(unexpected) > 3 else ''})")
