"""The checkpoint format: the one module that knows how tokenmix and others lay checkpoints out.

Every file is read once (``read_checkpoint``): its bytes are hashed (sha256) and deserialised from memory with
``torch.load(weights_only=True)``. Layouts, as timm keeps foreign layouts in one ``checkpoint_filter_fn``:
(a) an official DINO released backbone (``dino_deitsmall16_pretrain.pth``), and this project's export of one (a
    plain ViT state dict; ``make export`` puts the config in a ``<file>.json`` sidecar holding the file's sha256);
(b) an official DINO training checkpoint (``main_dino.py``'s ``checkpoint.pth``, the released
    ``*_full_checkpoint.pth``): ``{"student", "teacher", "optimizer", "epoch", "args", "dino_loss"}``, the student
    under DDP (``module.backbone.*``), the teacher plain (``backbone.*``), ``head.*`` dropped; teacher by default, as
    DINO's evaluations do. ``args`` is an ``argparse.Namespace``, allowed by ``tokenmix.io.safe_torch_load``;
(c) this project's Lightning checkpoints: ``state_dict`` keys ``teacher.backbone.*`` / ``student.backbone.*``
    (label-supervised runs: ``backbone.*``, ``kind == "supervised"``) and ``checkpoint["tokenmix"]`` (``ENTRY``,
    written by ``write_entry``) whose ``backbone`` is a ``BackboneConfig`` as a plain dict;
(d) torchvision ``VisionTransformer`` weights, plain or in detectron2's layout
    ``{"model": {"model.<torchvision key>": ...}, "iteration": ...}`` (the LaSt-ViT release);
(e) other projects' ViTs: a plain state dict or ``{"model": state dict}`` (DeiT, MAE releases) in timm's keys, the
    DINOv2 torch.hub layout (and its training checkpoints: ``{"model": {"teacher.backbone.*"}}``,
    ``{"teacher": {"backbone.*"}}``), or a timm model's weights (``.pth`` or ``.safetensors``) with its timm name
    (``read_checkpoint(path, arch="vit_small_patch14_reg4_dinov2")``). Without a recorded config, what the keys
    decide beyond the shapes is ``foreign.layout_config``'s (MAE's ``fc_norm`` without ``norm``: ``global_pool``).
Foreign keys become ours in ``backbones/foreign.py`` (``filter_state_dict``: one filter, as timm's
``checkpoint_filter_fn``), which refuses an unknown layout naming its keys and the layouts known.
A classifier ``head.*`` is loaded only into a model built with ``num_classes``; a backbone without a head
(probes, analyses) ignores it.

    ck = read_checkpoint("runs/entmax/pretrain/demo/version_0/checkpoints/last.ckpt")
    ck.sha256, ck.config          # hash of the bytes read, BackboneConfig (recorded, or inferred from shapes)
    model = ck.build()            # = backbone_from_checkpoint(path)
"""
from __future__ import annotations

import hashlib
import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

import torch

from tokenmix.io import CheckpointError, read_file_bytes, safe_torch_load

from .config import ARCHS, BackboneConfig
from .foreign import filter_state_dict, layout_config, timm_config
from .vit import TokenMixViT, create_vit

ENTRY = "tokenmix"  # checkpoint[ENTRY]: what this project writes beside the weights
DINO, SUPERVISED = "dino_pretrain", "supervised"
# kind -> (prefix of the backbone in state_dict, prefixes a complete checkpoint of that kind has)
LIGHTNING_LAYOUT = {
    DINO: ("{which}.backbone.", ("student.backbone.", "student.head.", "teacher.backbone.", "teacher.head.")),
    SUPERVISED: ("backbone.", ("backbone.", "backbone.head.")),
}


def runtime_record(model: torch.nn.Module) -> dict:
    """How ``model`` computes, beside what rebuilds its weights (``BackboneConfig``): the resolved GEMM backend of
    its linear layers (``backbones/linear.py``; ``auto`` resolves per host, so a resume on another CPU vendor
    could otherwise change the rounding unseen). On a GPU that is the device type (``cuda``): the layers run
    ``F.linear`` there whatever the host CPU's vendor resolved ``auto`` to."""
    from .linear import FastLinear
    device = next(model.parameters(), torch.empty(0)).device
    if device.type != "cpu":
        return {"linear_backend": device.type}
    backends = sorted({m.backend for m in model.modules() if isinstance(m, FastLinear)})
    return {"linear_backend": ",".join(backends) or "aten"}


def write_entry(checkpoint: dict, config: BackboneConfig, kind: str, runtime: Optional[dict] = None,
                **extra: Any) -> dict:
    """``checkpoint["tokenmix"]``: the backbone config (plain types, weights_only-loadable), its arch/variant (kept
    at the top for older readers), the kind of run, ``runtime`` (``runtime_record``) and ``extra`` (plain values)."""
    if kind not in LIGHTNING_LAYOUT:
        raise ValueError(f"kind must be one of {', '.join(LIGHTNING_LAYOUT)}, got {kind!r}")
    checkpoint[ENTRY] = {"backbone": config.to_dict(), "variant": config.variant, "arch": config.arch,
                         "kind": kind, **({"runtime": dict(runtime)} if runtime else {}), **extra}
    return checkpoint[ENTRY]


def read_entry(checkpoint: Mapping[str, Any], source: str = "checkpoint") -> tuple[BackboneConfig, dict]:
    """``(BackboneConfig, entry)`` of a tokenmix checkpoint; ``CheckpointError`` when it has no entry or a config
    this version cannot build. Entries older than ``kind`` are DINO pretraining ones."""
    entry = checkpoint.get(ENTRY) if isinstance(checkpoint, Mapping) else None
    if not isinstance(entry, Mapping) or "backbone" not in entry:
        raise CheckpointError(f"{source}: no '{ENTRY}' entry with the backbone config: not a checkpoint written by "
                              "tokenmix. Official DINO and torchvision weights load with backbones.load_checkpoint / "
                              "backbone_from_checkpoint on the weights file.")
    return BackboneConfig.from_dict(entry["backbone"], source), {"kind": DINO, **entry}


def check_resume_config(checkpoint: Mapping[str, Any], mine: BackboneConfig, kind: str,
                        runtime: Optional[dict] = None) -> dict:
    """The entry of the checkpoint a ``kind`` run building ``mine`` resumes from (Lightning's
    ``on_load_checkpoint``); ``CheckpointError`` for another kind of run or another backbone config. A
    ``runtime`` record (``runtime_record``) other than the checkpoint's is allowed but warned, naming both."""
    config, entry = read_entry(checkpoint)
    theirs_rt = entry.get("runtime") or {}
    for k, v in (runtime or {}).items():
        if k in theirs_rt and theirs_rt[k] != v:
            warnings.warn(f"resuming a run trained with {k}={theirs_rt[k]} under {k}={v}: the same arithmetic in "
                          f"another order, so the continuation is not bitwise the run that {theirs_rt[k]} would "
                          f"have produced (set TOKENMIX_LINEAR_BACKEND={theirs_rt[k]} to keep it)", stacklevel=2)
    if entry["kind"] != kind:
        raise CheckpointError(f"a {entry['kind']} checkpoint, not a {kind} one; RESUME continues runs of the same "
                              "objective")
    theirs, ours = config.to_dict(), mine.to_dict()
    diff = [k for k in dict.fromkeys([*theirs, *ours]) if theirs.get(k) != ours.get(k)]
    if diff:
        raise CheckpointError("checkpoint was trained with " + ", ".join(f"{k}={theirs.get(k)!r}" for k in diff)
                              + " but this run builds " + ", ".join(f"{k}={ours.get(k)!r}" for k in diff)
                              + "; pass the matching VARIANT / preset")
    return entry


def validate_lightning(checkpoint: Any, source: str, kind: str = DINO) -> dict:
    """A complete tokenmix Lightning checkpoint of ``kind`` (what RESUME and ``make export`` accept)."""
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise CheckpointError(f"{source}: not a Lightning checkpoint (no 'state_dict'); RESUME expects a .ckpt "
                              "written by `make pretrain` (e.g. runs/<variant>/pretrain/.../checkpoints/last.ckpt)")
    if not isinstance(checkpoint.get(ENTRY), dict):
        raise CheckpointError(f"{source}: a foreign Lightning checkpoint (no '{ENTRY}' entry); RESUME only continues "
                              "tokenmix pretraining runs. To start from official DINO weights use "
                              "backbones.load_checkpoint on the backbone instead.")
    have, prefixes = checkpoint[ENTRY].get("kind", DINO), LIGHTNING_LAYOUT[kind][1]
    if have != kind:
        raise CheckpointError(f"{source}: a {have} checkpoint, not a {kind} one (which holds "
                              f"{', '.join(p + '*' for p in prefixes)} tensors)")
    keys = checkpoint["state_dict"].keys()
    for prefix in prefixes:
        if not any(k.startswith(prefix) for k in keys):
            raise CheckpointError(f"{source}: no '{prefix}*' tensors in state_dict; the file is not a complete "
                                  f"{kind} checkpoint")
    read_entry(checkpoint, source)
    return checkpoint


def _strip(sd: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    return {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in sd.items()}


def extract_backbone_state(obj: Any, which: str = "teacher",
                           source: str = "checkpoint") -> tuple[dict, dict, str]:
    """``(backbone state dict in timm keys, tokenmix entry or {}, layout)`` from any supported checkpoint object;
    layout: ``tokenmix`` (a Lightning checkpoint) or a ``backbones.foreign.LAYOUTS`` name."""
    if which not in ("teacher", "student"):
        raise ValueError(f"which must be 'teacher' or 'student', got {which!r}")
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"{source}: expected a dict of tensors, got {type(obj).__name__}")
    entry: dict = {}
    if isinstance(obj.get("state_dict"), Mapping):  # (c) Lightning checkpoint: only ours are understood
        _, entry = read_entry(obj, source)
        prefix = LIGHTNING_LAYOUT[entry["kind"]][0].format(which=which) if entry["kind"] in LIGHTNING_LAYOUT else ""
        sd = obj["state_dict"]
        if not prefix or not any(k.startswith(prefix) for k in sd):
            raise CheckpointError(f"{source}: a {entry['kind']!r} Lightning checkpoint without '{prefix}*' keys; not "
                                  f"a tokenmix pretraining checkpoint (first keys: {list(sd)[:5]})")
        sd = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}
        return dict(sd), entry, "tokenmix"
    if isinstance(obj.get(which), Mapping):  # (b) DINO / DINOv2 training checkpoint: its backbone, no heads
        sd = _backbone_part(_strip(obj[which], "module."), "backbone.")
    elif isinstance(obj.get("model"), Mapping) and obj["model"]:  # (d) detectron2, (e) DINOv2 training, DeiT, MAE
        sd = obj["model"]
        for prefix in ("model.", f"{which}.backbone."):
            if any(str(k).startswith(prefix) for k in sd):
                sd = _backbone_part(sd, prefix)
                break
    elif all(isinstance(v, torch.Tensor) for v in obj.values()) and obj:  # (a) plain state dict
        sd = _strip(_strip(dict(obj), "module."), "backbone.")
    else:
        raise CheckpointError(f"{source}: unrecognised checkpoint layout (top-level keys: {list(obj)[:8]}); "
                              "expected a ViT state dict, a DINO training checkpoint or a tokenmix .ckpt")
    sd, layout = filter_state_dict(sd, source)  # (a), (b), (d), (e): foreign keys -> ours
    return sd, entry, layout


def _backbone_part(sd: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """The ``prefix*`` tensors without the prefix, where there are any (heads and the other network dropped)."""
    if not any(str(k).startswith(prefix) for k in sd):
        return {k: v for k, v in sd.items() if not k.startswith("head.")}
    return {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}


def _sidecar_config(path: Path, sha256: str) -> Optional[BackboneConfig]:
    """The config ``make export`` wrote beside a plain state dict (``<file>.json``), if it describes these bytes."""
    side = path.with_name(path.name + ".json")
    if not side.is_file():
        return None
    meta = json.loads(side.read_text())
    if not isinstance(meta, dict) or "backbone" not in meta:
        return None
    if meta.get("sha256") not in (None, sha256):
        raise CheckpointError(f"{side} describes another file (sha256 {meta['sha256'][:12]}…, this one "
                              f"{sha256[:12]}…): delete the stale sidecar or export again")
    return BackboneConfig.from_dict(meta["backbone"], str(side))


_FIELDS = set(BackboneConfig.__dataclass_fields__)


@dataclass
class BackboneCheckpoint:
    """One checkpoint file, read once: the backbone's weights (timm keys), its config and the file's sha256."""
    path: Path
    sha256: str
    state_dict: dict[str, torch.Tensor]
    config: BackboneConfig
    recorded: bool                  # config written in the file (or its export sidecar), not inferred from shapes
    entry: dict = field(default_factory=dict)   # checkpoint["tokenmix"] ({} for foreign files)
    progress: dict = field(default_factory=dict)  # epoch / global_step / iteration where the file has them
    layout: str = "tokenmix"        # "tokenmix" (a Lightning checkpoint) or a backbones.foreign.LAYOUTS name

    def build(self, strict: bool = True, **overrides: Any) -> TokenMixViT:
        """The recorded backbone with these weights; ``overrides``: config fields (``variant="lastvit"`` for weights
        that carry none, ``num_classes`` for a classifier) or runtime choices (``entmax_backend``)."""
        fields = {k: v for k, v in overrides.items() if k in _FIELDS}
        config = BackboneConfig.from_dict({**self.config.to_dict(), **fields}, str(self.path))
        model = create_vit(**config.to_dict(), **{k: v for k, v in overrides.items() if k not in _FIELDS})
        self.load_into(model, strict=strict)
        return model

    def load_into(self, model: TokenMixViT, strict: bool = True) -> dict:
        """Load the weights into ``model``; returns ``{"missing": [...], "unexpected": [...]}``.

        Refuses (``CheckpointError``) a checkpoint recorded for another arch/variant, any shape mismatch, and,
        unless ``strict=False``, any missing or unexpected key (all of them named in the message).
        """
        path, sd, mine = self.path, self.state_dict, getattr(model, "config", {})
        for key in ("arch", "variant") if self.recorded else ():
            value = getattr(self.config, key)
            if key in mine and value != mine[key]:
                raise CheckpointError(
                    f"{path}: checkpoint was trained as {key}={value!r} but the model is {key}={mine[key]!r}. "
                    f"Build the model with backbones.backbone_from_checkpoint('{path}') or pass the matching {key}.")
        own = model.state_dict()
        if not any(k.startswith("head.") for k in own):  # a feature backbone: a classifier head is not part of it
            sd = {k: v for k, v in sd.items() if not k.startswith("head.")}
        bad_shapes = [f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}"
                      for k, v in sd.items() if k in own and tuple(v.shape) != tuple(own[k].shape)]
        if bad_shapes:
            raise CheckpointError(f"{path}: shape mismatch (another architecture?):\n  " + "\n  ".join(bad_shapes[:20]))
        missing = sorted(set(own) - set(sd))
        unexpected = sorted(set(sd) - set(own))
        if strict and (missing or unexpected):
            raise CheckpointError(f"{path}: keys do not match the {mine.get('arch', '?')}/{mine.get('variant', '?')} "
                                  f"backbone.\n  missing: {missing}\n  unexpected: {unexpected}\n"
                                  "Pass strict=False to load the rest anyway.")
        model.load_state_dict({k: v for k, v in sd.items() if k in own}, strict=False)
        return {"missing": missing, "unexpected": unexpected}


def read_checkpoint(path: str | Path, which: str = "teacher", arch: Optional[str] = None) -> BackboneCheckpoint:
    """Read ``path`` once: sha256 of its bytes, weights-only deserialisation from memory (``.safetensors`` too),
    layout, config: recorded (the file, its export sidecar), else that of timm model ``arch`` (a name that is not
    a tokenmix arch: ``backbones.foreign.timm_config``), else inferred from the shapes."""
    path = Path(path)
    named = timm_config(arch) if arch and arch not in ARCHS else None  # a wrong name fails before a large read
    data = read_file_bytes(path)
    sha256 = hashlib.sha256(data).hexdigest()
    if data[8:10] == b'{"' and int.from_bytes(data[:8], "little") < len(data):  # safetensors: header size, JSON
        from safetensors.torch import load as load_safetensors
        try:
            obj = load_safetensors(data)
        except Exception as e:  # a truncated or foreign file: say which
            raise CheckpointError(f"{path}: starts as a safetensors file but cannot be read ({e})") from e
    else:
        obj = safe_torch_load(data, name=str(path))
    del data
    sd, entry, layout = extract_backbone_state(obj, which, str(path))
    progress = {k: obj[k] for k in ("epoch", "global_step", "iteration") if isinstance(obj.get(k), int)}
    config = BackboneConfig.from_dict(entry["backbone"], str(path)) if entry else _sidecar_config(path, sha256)
    recorded = config is not None
    if config is None and named is not None:
        config = BackboneConfig.from_dict(named, f"{path} (timm model {arch})")
    if config is None:
        config = BackboneConfig.from_dict({**infer_config(sd), **layout_config(layout, sd)},
                                          f"{path} (inferred from shapes)")
    return BackboneCheckpoint(path, sha256, sd, config, recorded, entry, progress, layout)


def load_checkpoint(model: TokenMixViT, path: str | Path, strict: bool = True, which: str = "teacher") -> dict:
    """Load backbone weights into ``model`` (see ``BackboneCheckpoint.load_into``)."""
    return read_checkpoint(path, which).load_into(model, strict=strict)


def infer_config(sd: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """Arch/variant of a state dict without metadata (official DINO files), from parameter shapes."""
    try:
        dim = sd["cls_token"].shape[-1]
        patch = sd["patch_embed.proj.weight"].shape[-1]
        n_pos = sd["pos_embed"].shape[1] - 1
    except KeyError as e:
        raise CheckpointError(f"not a ViT state dict: missing {e}") from e
    depth = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("blocks."))
    # the width picks the arch, for its heads (the one shape a state dict does not show: one count per width in
    # ARCHS); the patch, depth and table size are the file's, recorded where they differ from the arch's
    name = max((n for n, a in ARCHS.items() if a["embed_dim"] == dim), default=None,
               key=lambda n: (ARCHS[n]["patch_size"] == patch, ARCHS[n]["depth"] == depth))
    if name is None:
        raise CheckpointError(f"no known arch of width embed_dim={dim} (patch {patch}, depth {depth}); "
                              f"known: {', '.join(ARCHS)}. For a timm model's weights give its timm name "
                              "(--arch <name>: read_checkpoint(path, arch=name))")
    a = ARCHS[name]
    config: dict[str, Any] = {"arch": name, "variant": "softmax"}
    config.update({k: v for k, v in (("patch_size", patch), ("depth", depth)) if v != a[k]})
    fc1 = sd.get("blocks.0.mlp.fc1.weight")
    if fc1 is not None and fc1.shape[0] != 4 * dim:
        raise CheckpointError(f"MLP width {fc1.shape[0]} is not 4 x {dim}: not a ViT the tokenmix backbone builds")
    if "blocks.0.ls1.gamma" in sd:  # LayerScale (DINOv2, DeiT III); the init value only matters untrained
        config["init_values"] = 1e-5
    side = int(math.isqrt(n_pos))
    if side * side == n_pos and side * patch != a["img_size"]:
        config["img_size"] = side * patch
    if "reg_token" in sd:
        config.update(variant="registers", num_registers=sd["reg_token"].shape[1])
    config.update(_infer_specialization(sd))
    return config


def _infer_specialization(sd: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """spec_blocks (and, where norms and q/k/v differ, spec_norm_blocks / spec_qkv_blocks) from the *_cls keys."""
    found = {c: sorted({int(k.split(".")[1]) for k in sd if k.startswith("blocks.") and f".{key}_cls." in k})
             for c, key in (("norm1", "norm1"), ("norm2", "norm2"), ("qkv", "attn.qkv"))}
    union = sorted({b for v in found.values() for b in v})
    if not union:
        return {}
    config: dict[str, Any] = {"variant": "specialization", "spec_blocks": union}
    if any(v != union for v in found.values()):
        config["spec_components"] = [c for c in ("norm1", "qkv", "norm2") if found[c]]
        if found["norm1"] and found["norm2"] and found["norm1"] != found["norm2"]:
            raise CheckpointError(f"norm1 and norm2 are specialised in different blocks ({found['norm1']} vs "
                                  f"{found['norm2']}); build the backbone yourself and use load_checkpoint")
        norms = found["norm1"] or found["norm2"]
        if norms and norms != union:
            config["spec_norm_blocks"] = norms
        if found["qkv"] and found["qkv"] != union:
            config["spec_qkv_blocks"] = found["qkv"]
    return config


def backbone_from_checkpoint(path: str | Path, which: str = "teacher", strict: bool = True,
                             **overrides: Any) -> TokenMixViT:
    """Build the backbone recorded in (or inferred from) a checkpoint and load its weights (one read)."""
    return read_checkpoint(path, which).build(strict=strict, **overrides)
