"""Shadow validation: prove an adapter really works against its pinned base.

The adapter is loaded onto the exact base it is bound to (recomputing the base's
digests first, with the manifest's bitsandbytes setup, eager attention) and run on its
golden set. It passes only if every check holds:

* rank within the fleet's ``max_lora_rank``; binding fields equal the catalog's;
* tensors finite and some lora_B non-zero (scanned before loading);
* what PEFT loaded equals the file: same LoRA tensors, same values, none on ``meta``;
* logits finite on the golden prompts in a padded batch;
* the adapter changes the base's logits beyond a tolerance (no no-op adapters);
* golden pass rate at least the threshold, with greedy decoding;
* re-validating the same version on the same golden set reproduces its outputs
  (otherwise the base or runtime drifted).

The output hash and the token-overlap drift against the previous version are reported.
``BaseSession`` loads a base once and swaps adapters in and out, which is what makes
validating fifty pending adapters cheap.
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable

from registry.bundle import ADAPTER_CONFIG_FILE, MANIFEST_FILE, WEIGHTS_FILE
from registry.catalog import BaseModelRecord, verify_base
from registry.digests import canonical_json, canonical_sha256
from registry.errors import ErrorCode, InvalidInput, LoragateError
from registry.golden import GoldenSet, match_case
from registry.manifest import normalize_rope_scaling
from registry.settings import Settings
from registry.weights import read_lora_structure, scan_lora_values

log = logging.getLogger("loragate.validation")
Progress = Callable[[str], None]


@dataclass(frozen=True)
class ValidationPolicy:
    pass_threshold: float = 0.8
    max_lora_rank: int = 16
    # the largest |logit change| an adapter may cause and still count as doing nothing
    noop_tolerance: float = 1e-4
    device: str = "cpu"
    hf_cache_dir: str | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> "ValidationPolicy":
        return cls(pass_threshold=settings.validation_threshold, max_lora_rank=settings.max_lora_rank,
                   hf_cache_dir=settings.hf_cache_dir)

    def with_(self, **changes) -> "ValidationPolicy":
        policy = replace(self, **changes)
        if not 0.0 <= policy.pass_threshold <= 1.0:
            raise InvalidInput(f"threshold {policy.pass_threshold} is not in [0, 1]", code=ErrorCode.INVALID_SETTING, field="threshold")
        return policy


@dataclass(frozen=True)
class Reference:
    """Earlier golden outputs to compare with: a previous version, or this one before."""

    version_id: str
    outputs: dict[str, str]
    output_sha256: str | None
    golden_set_digest: str | None
    same_version: bool


@dataclass
class AdapterUnderTest:
    name: str
    bundle_dir: Path
    manifest: dict[str, Any]
    golden: GoldenSet
    version_id: str | None = None
    reference: Reference | None = None


@dataclass
class LiveAdapter:
    """The adapter slot currently attached to the base, and what its fresh load built."""

    slot: str
    targets: Any
    shapes: dict[str, tuple[int, ...]]
    state: dict[str, Any]  # PEFT's views of the slot's LoRA tensors (updated in place by hotswaps)
    layers: list[Any]  # the LoRA layers holding the slot, whose scaling a hotswap sets
    on_meta: list[str]
    healthy: bool = False


@dataclass
class Checks:
    """Accumulates check results and the diagnostics of the failed ones."""

    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def record(self, name: str, ok: bool, diagnostic: str = "", **figures: Any) -> bool:
        self.results[name] = {"ok": ok, **figures}
        if not ok:
            self.failures.append(f"{name}: {diagnostic}")
        return ok


def _output_sha256(outputs: dict[str, str]) -> str:
    return canonical_sha256(outputs)


def token_overlap_delta(a: list[int], b: list[int]) -> float:
    """1 - multiset overlap of two token sequences (0: same tokens, 1: disjoint)."""
    if not a and not b:
        return 0.0
    common = sum((Counter(a) & Counter(b)).values())
    return 1.0 - common / max(len(a), len(b))


def _quiet_loading():
    """transformers/PEFT/bitsandbytes chatter (progress bars, kernel notes) off."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    for noisy in ("bitsandbytes", "peft", "accelerate"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="peft")


class BaseSession:
    """One pinned base loaded once, with adapters attached and removed one at a time."""

    def __init__(self, record: BaseModelRecord, quantization_config: dict[str, Any] | None, device: str = "cpu",
                 hf_cache_dir: str | None = None):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig

        _quiet_loading()
        self.record = record
        self.quantization_config = quantization_config
        self.device = device
        started = time.perf_counter()
        self.directory = verify_base(record, hf_cache_dir)
        kwargs: dict[str, Any] = {"attn_implementation": "eager", "dtype": torch.float32}
        if quantization_config and quantization_config.get("load_in_4bit"):
            compute = getattr(torch, quantization_config["bnb_4bit_compute_dtype"])
            kwargs["dtype"] = compute
            kwargs["quantization_config"] = BitsAndBytesConfig(
                load_in_4bit=True,
                bnb_4bit_compute_dtype=compute,
                bnb_4bit_quant_type=quantization_config["bnb_4bit_quant_type"],
                bnb_4bit_use_double_quant=quantization_config["bnb_4bit_use_double_quant"],
            )
        self.tokenizer = AutoTokenizer.from_pretrained(self.directory)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(self.directory, **kwargs)
        if device != "cpu" and not quantization_config:
            self.model.to(device)
        self.model.eval()
        self.peft = None
        self._slot = 0
        self._live: LiveAdapter | None = None
        self._base_runs: dict[str, dict[str, Any]] = {}
        self._encodings: dict[str, Any] = {}
        self.load_seconds = time.perf_counter() - started

    # -- running prompts --------------------------------------------------------

    def _generate(self, golden: GoldenSet) -> dict[str, Any]:
        import torch

        if golden.digest not in self._encodings:
            prompts = [c.prompt for c in golden.cases]
            self._encodings[golden.digest] = self.tokenizer(prompts, return_tensors="pt", padding=True).to(self.device)
        enc = self._encodings[golden.digest]
        model = self.peft if self.peft is not None else self.model
        with torch.no_grad():
            out = model.generate(
                **enc,
                max_new_tokens=golden.max_tokens,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        width = enc["input_ids"].shape[1]
        token_ids, texts = {}, {}
        eos = self.tokenizer.eos_token_id
        for case, row in zip(golden.cases, out.sequences[:, width:].tolist()):
            row = row[: case.max_tokens]
            if eos in row:
                row = row[: row.index(eos)]
            row = [t for t in row if t != self.tokenizer.pad_token_id]
            token_ids[case.id] = row
            texts[case.id] = self.tokenizer.decode(row, skip_special_tokens=True)
        steps = torch.stack([s.float() for s in out.logits])  # [steps, batch, vocab]
        return {
            "first_logits": out.logits[0].float(),
            "nonfinite_logits": int((~torch.isfinite(steps)).sum()),
            "token_ids": token_ids,
            "texts": texts,
        }

    def base_run(self, golden: GoldenSet) -> dict[str, Any]:
        """The bare base on a golden set, computed once per set and reused."""
        if golden.digest not in self._base_runs:
            if self.peft is not None:
                with self.peft.disable_adapter():
                    self._base_runs[golden.digest] = self._generate(golden)
            else:
                self._base_runs[golden.digest] = self._generate(golden)
        return self._base_runs[golden.digest]

    # -- attaching adapters -----------------------------------------------------

    def _attach(self, bundle_dir: Path, adapter_config: dict[str, Any], file_tensors: dict[str, Any]) -> tuple[str, Any]:
        """Put the adapter in the live slot; returns how ("hotswap" or "fresh") and PEFT's
        load result for a fresh load.

        A hotswap copies the new weights into the live slot's LoRA layers and sets their
        scaling, which is what PEFT's ``hotswap_adapter`` does, without its per-key module
        lookups (they cost more than the copy). It is only used when a fresh load would
        build exactly the same layers -- same target_modules, same tensor names and
        shapes, no DoRA or per-module patterns -- and the live slot itself loaded cleanly.
        Anything else goes through PEFT's own loading, so its silent failures show up the
        way they would in serving.
        """
        from peft import PeftModel
        from peft.tuners.lora import LoraLayer
        from peft.utils import get_peft_model_state_dict

        targets = _targets(adapter_config)
        shapes = {k: tuple(t.shape) for k, t in file_tensors.items()}
        plain = not (adapter_config.get("use_dora") or adapter_config.get("rank_pattern") or adapter_config.get("alpha_pattern"))
        live = self._live
        if live is not None and live.healthy and plain and live.targets == targets and live.shapes == shapes:
            import torch

            rank, alpha = adapter_config["r"], adapter_config["lora_alpha"]
            scaling = alpha / math.sqrt(rank) if adapter_config.get("use_rslora") else alpha / rank
            with torch.no_grad():
                for key, tensor in file_tensors.items():
                    live.state[key].copy_(tensor)
            for module in live.layers:
                module.scaling[live.slot] = scaling
            return "hotswap", None
        self._detach()
        self._slot += 1
        slot = f"v{self._slot}"
        load_result = None
        if self.peft is None:
            self.peft = PeftModel.from_pretrained(self.model, str(bundle_dir), adapter_name=slot, low_cpu_mem_usage=True, is_trainable=False)
        else:
            load_result = self.peft.load_adapter(str(bundle_dir), adapter_name=slot, low_cpu_mem_usage=True, is_trainable=False)
        self.peft.set_adapter(slot)
        self.peft.eval()
        self._live = LiveAdapter(
            slot=slot,
            targets=targets,
            shapes=shapes,
            state=get_peft_model_state_dict(self.peft, adapter_name=slot),
            layers=[m for m in self.peft.modules() if isinstance(m, LoraLayer) and slot in m.scaling],
            on_meta=sorted(n for n, p in self.peft.named_parameters() if f".{slot}." in n and p.device.type == "meta"),
        )
        return "fresh", load_result

    def _detach(self) -> None:
        if self._live is not None:
            if self._live.slot in self.peft.peft_config:
                self.peft.delete_adapter(self._live.slot)
            self._live = None

    def _loaded_state(self, file_tensors: dict[str, Any]) -> dict[str, Any]:
        """Compare what PEFT holds in the live slot with the file, tensor by tensor."""
        import torch

        held = self._live.state
        missing = sorted(set(held) - set(file_tensors))  # initialised, never loaded
        dropped = sorted(set(file_tensors) - set(held))  # in the file, silently ignored
        shared = sorted(k for k in set(held) & set(file_tensors) if held[k].device.type != "meta")

        # PEFT round-trips weights through a float16/bfloat16 compute dtype: allow that
        # rounding (bfloat16 keeps ~3 significant digits), nothing like a weight left at init
        def close(keys: list[str]) -> bool:
            if not keys:
                return True
            a = torch.cat([held[k].detach().cpu().float().flatten() for k in keys])
            b = torch.cat([file_tensors[k].float().flatten() for k in keys])
            return torch.allclose(a, b, rtol=1e-2, atol=1e-6)

        # one comparison for the whole slot; per tensor only to name the culprits
        differing = [] if close(shared) else [k for k in shared if not close([k])]
        return {
            "lora_tensors_loaded": len(held),
            "lora_params_loaded": int(sum(t.numel() for t in held.values())),
            "missing_keys": missing[:5],
            "missing_count": len(missing),
            "unexpected_keys": dropped[:5],
            "unexpected_count": len(dropped),
            "differing_values": differing[:5],
            "meta_params": self._live.on_meta[:5],
            "meta_count": len(self._live.on_meta),
        }

    # -- the gate ---------------------------------------------------------------

    def validate(self, target: AdapterUnderTest, policy: ValidationPolicy) -> dict[str, Any]:
        from safetensors.torch import load_file

        started = time.perf_counter()
        checks = Checks()
        timing: dict[str, float] = {}
        manifest = target.manifest
        report: dict[str, Any] = {
            "version_id": target.version_id,
            "name": target.name,
            "base": {"base_model_id": self.record.base_model_id, "base_model_commit": self.record.base_model_commit,
                     "quantization_config": self.quantization_config},
            "golden_set_digest": target.golden.digest,
            "threshold": policy.pass_threshold,
        }
        rank = manifest.get("lora_rank")
        checks.record("rank", isinstance(rank, int) and rank <= policy.max_lora_rank,
                      f"lora_rank {rank} is above the fleet's max_lora_rank {policy.max_lora_rank}",
                      lora_rank=rank, max_lora_rank=policy.max_lora_rank)
        self._check_binding(manifest, checks)

        weights_path = Path(target.bundle_dir) / WEIGHTS_FILE
        try:
            structure = read_lora_structure(weights_path)
        except LoragateError as e:
            checks.record("weights", False, e.message)
            return self._finish(report, checks, timing, started, None)
        scan = scan_lora_values(weights_path, (structure.tensors, structure.data_start))
        checks.record("weights", scan.problem() is None, scan.problem() or "",
                      lora_tensors_in_file=len(structure.tensors), lora_params_in_file=structure.parameter_count,
                      nonfinite_tensors=list(scan.nonfinite_tensors[:5]))
        # PEFT's in-memory config goes stale after a hotswap: the file on disk is the truth
        adapter_config = json.loads((Path(target.bundle_dir) / ADAPTER_CONFIG_FILE).read_text())
        checks.results["weights"]["adapter_config_lora_alpha"] = adapter_config.get("lora_alpha")
        file_tensors = load_file(str(weights_path))

        t0 = time.perf_counter()
        try:
            mode, load_result = self._attach(Path(target.bundle_dir), adapter_config, file_tensors)
        except Exception as e:  # PEFT raises plain ValueError/RuntimeError on bad targets
            self._detach()
            checks.record("load", False, f"PEFT refused the adapter: {type(e).__name__}: {e}")
            return self._finish(report, checks, timing, started, None)
        timing["load_s"] = time.perf_counter() - t0
        try:
            loaded = self._loaded_state(file_tensors)
            loaded["mode"] = mode
            if load_result is not None:
                loaded["peft_reported_unexpected"] = len(load_result.unexpected_keys)
                loaded["peft_reported_missing"] = len(load_result.missing_keys)
            load_ok = not (loaded["missing_count"] or loaded["unexpected_count"] or loaded["meta_count"] or loaded["differing_values"])
            reasons = []
            if loaded["unexpected_count"]:
                reasons.append(f"{loaded['unexpected_count']} tensors in the file were dropped, e.g. {loaded['unexpected_keys'][0]} (target_modules lists fewer modules than the file holds, or the base has fewer layers)")
            if loaded["missing_count"]:
                reasons.append(f"{loaded['missing_count']} LoRA tensors never loaded, e.g. {loaded['missing_keys'][0]} (renamed or stripped key prefix)")
            if loaded["meta_count"]:
                reasons.append(f"{loaded['meta_count']} LoRA parameters left on the meta device")
            if loaded["differing_values"]:
                reasons.append(f"loaded values differ from the file for {loaded['differing_values'][0]}")
            count_ok = loaded["lora_params_loaded"] == structure.parameter_count and loaded["lora_params_loaded"] > 0
            if not count_ok and not reasons:
                reasons.append(f"LoRA parameter count {loaded['lora_params_loaded']} != {structure.parameter_count} in the file")
            checks.record("load", load_ok and count_ok, "; ".join(reasons), **loaded)
            self._live.healthy = load_ok and count_ok

            t0 = time.perf_counter()
            base = self.base_run(target.golden)
            timing["base_forward_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            run = self._generate(target.golden)
            timing["forward_s"] = time.perf_counter() - t0
        except BaseException:
            self._detach()  # never leave a half-checked adapter in the live slot
            raise

        checks.record("finite", run["nonfinite_logits"] == 0,
                      f"{run['nonfinite_logits']} non-finite logits on the golden prompts"
                      + (f" under compute dtype {self.quantization_config['bnb_4bit_compute_dtype']}" if self.quantization_config else ""),
                      nonfinite_logits=run["nonfinite_logits"])
        delta = (run["first_logits"] - base["first_logits"]).abs()
        max_delta = float(delta.nan_to_num(nan=float("inf")).max()) if delta.numel() else 0.0
        same_as_base = sum(run["texts"][c.id] == base["texts"][c.id] for c in target.golden.cases)
        checks.record("noop", max_delta > policy.noop_tolerance,
                      f"the adapter changes logits by at most {max_delta:.2e} (tolerance {policy.noop_tolerance:.0e}): it has no effect; "
                      "check lora_alpha, the lora_B weights and the key prefix",
                      max_abs_logit_delta=max_delta, tolerance=policy.noop_tolerance,
                      completions_equal_to_base=same_as_base)

        cases, passed = [], 0
        base_passed = 0
        for case in target.golden.cases:
            ok, why = match_case(case, run["texts"][case.id])
            base_passed += match_case(case, base["texts"][case.id])[0]
            passed += ok
            cases.append({"id": case.id, "kind": case.kind, "completion": run["texts"][case.id], "passed": ok, "why": why})
        total = len(target.golden.cases)
        rate = passed / total if total else 0.0
        checks.record("golden", rate >= policy.pass_threshold,
                      f"passed {passed}/{total} golden cases ({rate:.2f} < {policy.pass_threshold:.2f})",
                      passed=passed, total=total, pass_rate=rate, threshold=policy.pass_threshold,
                      base_pass_rate=base_passed / total if total else 0.0)
        report["cases"] = cases
        outputs = run["texts"]
        report["output_sha256"] = _output_sha256(outputs)
        report["drift"] = self._drift(target, run, checks)
        return self._finish(report, checks, timing, started, outputs)

    def _check_binding(self, manifest: dict[str, Any], checks: Checks) -> None:
        rec = self.record
        wrong = []
        if manifest.get("base_model_id") != rec.base_model_id:
            wrong.append(f"base_model_id {manifest.get('base_model_id')!r} != {rec.base_model_id!r}")
        for key, pinned in (("base_model_commit", rec.base_model_commit), ("base_config_sha256", rec.config_sha256),
                            ("tokenizer_revision", rec.tokenizer_revision)):
            if manifest.get(key) is not None and manifest[key] != pinned:
                wrong.append(f"{key} {str(manifest[key])[:19]} != pinned {pinned[:19]}")
        if "rope_scaling" in manifest and normalize_rope_scaling(manifest["rope_scaling"]) != rec.rope_scaling:
            wrong.append(f"rope_scaling {manifest['rope_scaling']} != pinned {rec.rope_scaling} (rope drift)")
        checks.record("binding", not wrong, "; ".join(wrong), base=rec.label)

    def _drift(self, target: AdapterUnderTest, run: dict[str, Any], checks: Checks) -> dict[str, Any] | None:
        ref = target.reference
        if ref is None:
            return None
        shared = [c for c in target.golden.cases if c.id in ref.outputs]
        deltas = {}
        for case in shared:
            before = self.tokenizer(ref.outputs[case.id], add_special_tokens=False).input_ids
            deltas[case.id] = token_overlap_delta(before, run["token_ids"][case.id])
        changed = sorted(cid for cid in deltas if ref.outputs[cid] != run["texts"][cid])
        drift = {
            "reference_version": ref.version_id,
            "same_version": ref.same_version,
            "shared_cases": len(shared),
            "changed_cases": changed,
            "mean_token_overlap_delta": (sum(deltas.values()) / len(deltas)) if deltas else None,
            "max_token_overlap_delta": max(deltas.values()) if deltas else None,
        }
        if ref.same_version and ref.golden_set_digest == target.golden.digest:
            # same weights, same prompts, greedy decoding: any change is the base or runtime
            checks.record("reproducible", not changed,
                          f"{len(changed)} golden outputs changed since this version's last passed run "
                          f"(e.g. {changed[:1]}): the base or the runtime drifted",
                          changed_cases=len(changed))
        return drift

    def _finish(self, report, checks: Checks, timing, started, outputs) -> dict[str, Any]:
        timing["total_s"] = time.perf_counter() - started
        report["checks"] = _json_safe(checks.results)
        report["failures"] = checks.failures
        report["status"] = "failed" if checks.failures else "passed"
        report["outputs"] = outputs
        report["timing"] = {k: round(v, 6) for k, v in timing.items()}
        golden = checks.results.get("golden")
        if golden:
            summary = f"golden {golden['passed']}/{golden['total']} (threshold {golden['threshold']:.2f})"
            noop = checks.results.get("noop", {})
            if "max_abs_logit_delta" in noop:
                summary += f", max logit delta {float(noop['max_abs_logit_delta']):.3g}"
            drift = report.get("drift")
            if drift and drift.get("mean_token_overlap_delta") is not None:
                summary += f", drift {drift['mean_token_overlap_delta']:.2f} vs {drift['reference_version']}"
        else:
            summary = "not run"
        if checks.failures:
            summary = f"{len(checks.failures)} check(s) failed: " + "; ".join(f.split(":")[0] for f in checks.failures) + f" ({summary})"
        report["summary"] = summary
        return report


def _targets(adapter_config: dict[str, Any]) -> Any:
    targets = adapter_config.get("target_modules")
    return sorted(targets) if isinstance(targets, list) else targets


def _json_safe(value: Any) -> Any:
    """Reports go to JSON columns: a non-finite figure is written as a string."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def failed_report(target: AdapterUnderTest, record: BaseModelRecord, error: LoragateError, threshold: float) -> dict[str, Any]:
    """The report of an adapter whose base could not even be loaded."""
    return {
        "version_id": target.version_id,
        "name": target.name,
        "base": {"base_model_id": record.base_model_id, "base_model_commit": record.base_model_commit},
        "golden_set_digest": target.golden.digest,
        "threshold": threshold,
        "status": "failed",
        "checks": {"base": {"ok": False, "code": error.code.value, "field": error.field}},
        "failures": [f"base: {error.message}"],
        "summary": f"base check failed: {error.code.value}",
        "outputs": None,
        "timing": {},
    }


def validate_group(record: BaseModelRecord, quantization_config: dict[str, Any] | None, targets: list[AdapterUnderTest],
                   policy: ValidationPolicy, progress: Progress = lambda _m: None) -> list[dict[str, Any]]:
    """Validate adapters that share one base and quantization setup, loading it once."""
    try:
        session = BaseSession(record, quantization_config, policy.device, policy.hf_cache_dir)
    except LoragateError as e:
        return [failed_report(t, record, e, policy.pass_threshold) for t in targets]
    progress(f"loaded base {record.label} in {session.load_seconds:.2f}s" + (" (4-bit)" if quantization_config else ""))
    reports = []
    for target in targets:
        report = session.validate(target, policy)
        reports.append(report)
        progress(f"{target.version_id or target.name}: {report['status']} - {report['summary']}")
    return reports


def _group_key(manifest: dict[str, Any]) -> tuple[str, str, bytes]:
    return manifest["base_model_id"], manifest["base_model_commit"], canonical_json(manifest.get("quantization_config"))


def validate_versions(registry, version_ids: Iterable[str], policy: ValidationPolicy,
                      progress: Progress = lambda _m: None) -> list[dict[str, Any]]:
    """Validate registered versions, grouped by base, and record every run.

    Bad input (unknown version, no golden set) is refused before any model is loaded.
    Returns the reports in the order the versions were given.
    """
    from registry.store import utcnow

    ids = list(dict.fromkeys(version_ids))
    versions = [registry.get_version(v) for v in ids]
    goldens = {}
    for v in versions:
        if v.name not in goldens:
            goldens[v.name] = registry.golden_set(v.name)
    reports: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="loragate-validate-") as tmp:
        targets: dict[tuple, list[tuple[Any, AdapterUnderTest]]] = {}
        for i, v in enumerate(versions):
            ref, golden = goldens[v.name]
            bundle = registry.materialize(v.version_id, Path(tmp) / f"{i:05d}")
            target = AdapterUnderTest(name=v.name, bundle_dir=bundle, manifest=v.manifest, golden=golden,
                                      version_id=v.version_id, reference=_reference_for(registry, v))
            targets.setdefault(_group_key(v.manifest), []).append((v, target))
        for (base_id, commit, _), members in targets.items():
            record = registry.store.get_base(base_id, commit)
            started = utcnow()
            group_reports = validate_group(record, members[0][1].manifest.get("quantization_config"),
                                           [t for _, t in members], policy, progress)
            for (version, target), report in zip(members, group_reports):
                run = registry.record_validation(version, {
                    "status": report["status"],
                    "golden_set_digest": target.golden.digest,
                    "output_sha256": report.get("output_sha256"),
                    "report": report,
                    "started_at": started,
                    "finished_at": utcnow(),
                })
                report["run_id"] = run.id
                reports[version.version_id] = report
    return [reports[v] for v in ids]


def _reference_for(registry, version) -> Reference | None:
    """This version's own last passed run if any (reproducibility), else the previous
    version's (drift between versions)."""
    own = [r for r in registry.store.validation_runs(version.version_id) if r.status == "passed"]
    if own:
        run, same = own[-1], True
    else:
        run, same = registry.store.latest_passed_run_before(version.name, version.created_at, version.version_id), False
    if run is None or not run.report.get("outputs"):
        return None
    return Reference(version_id=run.version_id, outputs=run.report["outputs"], output_sha256=run.output_sha256,
                     golden_set_digest=run.golden_set_digest, same_version=same)


def validate_bundle(record: BaseModelRecord, bundle_dir: Path, golden: GoldenSet, policy: ValidationPolicy,
                    name: str = "bundle", reference: Reference | None = None) -> dict[str, Any]:
    """Validate one bundle that is not (yet) registered: the same gate, no bookkeeping."""
    manifest = _read_manifest(Path(bundle_dir))
    target = AdapterUnderTest(name=name, bundle_dir=Path(bundle_dir), manifest=manifest, golden=golden, reference=reference)
    return validate_group(record, manifest.get("quantization_config"), [target], policy)[0]


def _read_manifest(bundle_dir: Path) -> dict[str, Any]:
    return json.loads((bundle_dir / MANIFEST_FILE).read_text())


# -- Prefect wrappers: thin, configuration passed in ------------------------------

from prefect import task  # noqa: E402  (after the plain functions on purpose)


@task(name="shadow-validate", log_prints=True)
def shadow_validate(settings: Settings, version_ids: list[str]) -> list[dict[str, Any]]:
    """Validate versions, record the runs and publish a summary table as a Prefect
    artifact; a failed adapter is rejected, never raised."""
    from prefect.artifacts import create_table_artifact
    from prefect.logging import get_run_logger

    from registry.service import Registry

    logger = get_run_logger()
    registry = Registry.open(settings)
    reports = validate_versions(registry, version_ids, ValidationPolicy.from_settings(settings), progress=logger.info)
    create_table_artifact(
        key="shadow-validation",
        table=summary_rows(reports),
        description=f"Shadow validation of {len(reports)} adapter version(s)",
    )
    return reports


def summary_rows(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per report, for tables in the Prefect UI."""
    rows = []
    for r in reports:
        golden = r.get("checks", {}).get("golden", {})
        rows.append({
            "version": r["version_id"],
            "adapter": r["name"],
            "status": r["status"],
            "golden": f"{golden['passed']}/{golden['total']}" if golden else "-",
            "failures": "; ".join(r["failures"]) or "-",
        })
    return rows
