"""What GPUs this machine has, read without holding a CUDA context in this process.

NVML gives names, memory, power, the energy-counter capability, MIG and compute modes (read
only: nothing here changes a GPU setting). The SM count comes from CUDA, which NVML does not
report; ``sm_counts`` asks torch in a short-lived subprocess so that the caller never holds a
context (about 50 W on an H100). Under MPS the same query inside a client reports the SMs that
client's active-thread percentage grants, which is how a GMI reports its slice.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from dataclasses import asdict, dataclass

from runtime.hw import nvml

logger = logging.getLogger(__name__)


def nvml_index(cuda_index: int = 0) -> int:
    """The NVML index of this process's CUDA device ``cuda_index``: ``known_nvml_index``, else
    ``cuda_index``."""
    known = known_nvml_index(cuda_index)
    return cuda_index if known is None else known


def known_nvml_index(cuda_index: int = 0) -> int | None:
    """The NVML index of this process's CUDA device ``cuda_index`` where it is known: its entry
    in ``CUDA_VISIBLE_DEVICES`` where that is an index (NVML counts in PCI bus order, as CUDA
    does with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or on GPUs of one kind), ``cuda_index`` where
    the variable is unset; None where it names the device otherwise (a UUID, a MIG instance)
    or has no entry for it."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return cuda_index
    entries = visible.split(",")
    entry = entries[cuda_index].strip() if 0 <= cuda_index < len(entries) else ""
    return int(entry) if entry.isdigit() else None


SM_QUERY = (
    "import json, torch\n"
    "n = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
    "props = [torch.cuda.get_device_properties(i) for i in range(n)]\n"
    "print(json.dumps([[p.multi_processor_count, str(getattr(p, 'uuid', ''))] for p in props]))\n"
)


@dataclass(frozen=True)
class GPUInfo:
    """One GPU as NVML reports it (index is NVML's)."""

    index: int
    name: str
    uuid: str
    memory_total_mib: int
    power_w: float | None
    energy_counter: bool
    """``nvmlDeviceGetTotalEnergyConsumption`` works (else power polling is needed)."""
    mig_mode: str
    """``enabled``, ``disabled`` or ``unsupported``: read only, never changed."""
    compute_mode: str
    compute_capability: tuple[int, int] | None = None
    """CUDA's (major, minor), None where NVML cannot say."""
    power_limit_w: float | None = None
    """The enforced power limit (read only), None where NVML cannot say."""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


BF16_CAPABILITY = (8, 0)
"""bfloat16 tensor-core matmuls came with Ampere (compute capability 8.0)."""


def bf16_problem(gpus: list[GPUInfo]) -> str | None:
    """Why a bfloat16 trainer cannot run on these GPUs, or None. Only a machine none of whose
    GPUs reports capability 8.0 or later is refused: NVML's order of GPUs need not be CUDA's,
    so on a mixed machine the GPU a trainer lands on cannot be told from here."""
    known = [g for g in gpus if g.compute_capability is not None]
    if not known or any(tuple(g.compute_capability) >= BF16_CAPABILITY for g in known):
        return None
    have = ", ".join(
        f"{g.name} ({g.compute_capability[0]}.{g.compute_capability[1]})" for g in known
    )
    return (
        f"trainer_precision='bf16' on cuda needs a GPU of compute capability 8.0 or later "
        f"(Ampere on); this machine has {have}: use trainer_precision='fp32', or "
        "trainer_device='cpu' on a CPU with bfloat16 instructions"
    )


_COMPUTE_MODES = {0: "default", 1: "exclusive-thread", 2: "prohibited", 3: "exclusive-process"}


def no_gpu_reason() -> str | None:
    """Why no GPU can be used here, or None where NVML sees at least one (no CUDA context)."""
    try:
        nvml.init()
        count = nvml.nvml_call("count GPUs", nvml.pynvml.nvmlDeviceGetCount)
    except nvml.NVMLUnavailable as exc:
        return f"no GPU that NVML can read ({exc})"
    return None if count else "NVML reports no GPUs"


def torch_sees_gpu() -> bool:
    """Whether torch can use a CUDA GPU here; where NVML sees none, False without importing
    torch (its import costs a process seconds, and the CLI and the runner need it no more)."""
    if no_gpu_reason() is not None:
        return False
    import torch

    return torch.cuda.is_available()


def list_gpus() -> list[GPUInfo]:
    """Every GPU NVML sees; an empty list where NVML is missing or has no driver."""
    try:
        nvml.init()
    except nvml.NVMLUnavailable as exc:
        logger.info("no GPUs: %s", exc)
        return []
    p = nvml.pynvml
    out = []
    for i in range(nvml.nvml_call("count GPUs", p.nvmlDeviceGetCount)):
        h = nvml.nvml_call(f"open GPU {i}", p.nvmlDeviceGetHandleByIndex, i)
        out.append(
            GPUInfo(
                index=i,
                name=_text(nvml.nvml_call("read the name", p.nvmlDeviceGetName, h)),
                uuid=_text(nvml.nvml_call("read the UUID", p.nvmlDeviceGetUUID, h)),
                memory_total_mib=int(
                    nvml.nvml_call("read memory", p.nvmlDeviceGetMemoryInfo, h).total // 2**20
                ),
                power_w=nvml.nvml_optional(lambda h=h: p.nvmlDeviceGetPowerUsage(h) / 1000.0),
                energy_counter=nvml.nvml_optional(p.nvmlDeviceGetTotalEnergyConsumption, h)
                is not None,
                mig_mode=_mig_mode(h),
                compute_mode=_COMPUTE_MODES.get(
                    nvml.nvml_optional(p.nvmlDeviceGetComputeMode, h), "unknown"
                ),
                compute_capability=_capability(h),
                power_limit_w=nvml.nvml_optional(
                    lambda h=h: p.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0
                ),
            )
        )
    return out


def gpus_used_by(pids: list[int]) -> set[int]:
    """NVML indices of the GPUs on which any of ``pids`` holds a compute context (empty where
    NVML is missing). Under MPS, clients may show as the MPS server's process instead."""
    try:
        nvml.init()
    except nvml.NVMLUnavailable:
        return set()
    p, wanted, used = nvml.pynvml, set(pids), set()
    for i in range(nvml.nvml_call("count GPUs", p.nvmlDeviceGetCount)):
        h = nvml.nvml_call(f"open GPU {i}", p.nvmlDeviceGetHandleByIndex, i)
        procs = nvml.nvml_optional(p.nvmlDeviceGetComputeRunningProcesses, h) or []
        if any(proc.pid in wanted for proc in procs):
            used.add(i)
    return used


def sm_counts(env: dict[str, str] | None = None, timeout_s: float = 120.0) -> list[int]:
    """SMs per visible CUDA device, as a fresh process sees them (under MPS: its slice).

    Args:
        env: Environment of the query process (e.g. with ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``).
        timeout_s: How long the query may take.

    Returns:
        One count per CUDA device (CUDA's order), or ``[]`` where CUDA is unavailable.
    """
    return [c for c, _ in _sm_query(env, timeout_s)]


def sm_counts_of(gpus: list[GPUInfo], timeout_s: float = 120.0) -> dict[int, int]:
    """The SMs of each of NVML's ``gpus``, by NVML index: read by a CUDA process that sees
    every GPU, numbered in PCI bus order as NVML numbers them, and paired by UUID where CUDA
    reports one. A GPU CUDA does not show (a MIG-mode GPU shows its instances) is left out."""
    env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return pair_sm_counts(gpus, _sm_query(env, timeout_s))


def _sm_query(env: dict[str, str] | None, timeout_s: float) -> list[tuple[int, str]]:
    """(SMs, UUID) of each CUDA device a fresh process with ``env`` sees; [] where CUDA is
    unavailable (said in the log)."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", SM_QUERY],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=True,
        )
        return [(int(c), str(u)) for c, u in json.loads(done.stdout.strip().splitlines()[-1])]
    except (subprocess.SubprocessError, ValueError, IndexError, TypeError) as exc:
        logger.warning("could not read SM counts through CUDA: %s", exc)
        return []


def pair_sm_counts(gpus: list[GPUInfo], found: list[tuple[int, str]]) -> dict[int, int]:
    """``found`` (SMs and UUID of each CUDA device, in PCI bus order) by the NVML index of
    the same GPU: by UUID where CUDA gave them, else by position."""
    by_uuid = {_bare(u): c for c, u in found if u}
    if by_uuid:
        pairs = ((g.index, by_uuid.get(_bare(g.uuid))) for g in gpus)
    else:
        pairs = ((g.index, found[g.index][0] if g.index < len(found) else None) for g in gpus)
    return {i: c for i, c in pairs if c}


def _bare(uuid: str) -> str:
    return uuid.strip().lower().removeprefix("gpu-")


def visible(gpus: list[GPUInfo]) -> list[GPUInfo]:
    """Those of NVML's ``gpus`` that ``CUDA_VISIBLE_DEVICES`` lets this process use: all of
    them where it is unset; else its entries in order, an index as NVML's (CUDA counts so
    with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or on GPUs of one kind) and ``GPU-<uuid>`` (or the
    start of one) as that GPU, up to the first entry that names no GPU, as CUDA reads it. A
    MIG instance (``MIG-...``) is not a whole GPU: it names none."""
    entries = os.environ.get("CUDA_VISIBLE_DEVICES")
    if entries is None:
        return list(gpus)
    out: list[GPUInfo] = []
    for entry in (e.strip() for e in entries.split(",")):
        if entry.isdigit():
            named = [g for g in gpus if g.index == int(entry)]
        elif entry.lower().startswith("gpu-") and len(entry) > 4:
            named = [g for g in gpus if _bare(g.uuid).startswith(_bare(entry))]
        else:
            named = []
        if len(named) != 1:
            break
        if named[0] not in out:
            out.append(named[0])
    return out


def _capability(handle: object) -> tuple[int, int] | None:
    try:
        found = nvml.nvml_optional(nvml.pynvml.nvmlDeviceGetCudaComputeCapability, handle)
    except AttributeError:  # an old nvidia-ml-py (an old driver: NVML fails, found is None)
        return None
    if found is None:
        return None
    major, minor = found
    return int(major), int(minor)


def _mig_mode(handle: object) -> str:
    p = nvml.pynvml
    found = nvml.nvml_optional(p.nvmlDeviceGetMigMode, handle)
    if found is None:
        return "unsupported"
    current, _pending = found
    return "enabled" if current == p.NVML_DEVICE_MIG_ENABLE else "disabled"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
