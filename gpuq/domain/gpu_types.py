"""What a GPU is: NVML's product names as the types people type (`--gpus a100:2`).

GPU types are NVML's product names normalised to what people type: "NVIDIA A100-SXM4-80GB" is
"a100", "NVIDIA H100 80GB HBM3" is "h100", "NVIDIA RTX 6000 Ada Generation" is "rtx6000ada".
A node has the types of its GPUs as features, so `--constraint a100` matches them too
(gpuq.domain.node_constraints).
"""

from __future__ import annotations

import re
from functools import lru_cache

from gpuq.domain.limits import shown
from gpuq.errors import InvalidInput

GPU_TYPE_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,31}")

# words of an NVML name that say who made it or which line it belongs to, not which GPU it is
_VENDOR_WORDS = frozenset({"nvidia", "tesla", "geforce", "quadro"})
# words that say how the card is built or sold (form factor, memory, edition): one model,
# whatever its board; memory is asked for with --gpu-mem
_NOISE_WORDS = frozenset(
    {
        *("pcie", "pci", "sxm", "sxm2", "sxm3", "sxm4", "sxm5", "sxm6", "nvl", "hbm2", "hbm2e"),
        *("hbm3", "hbm3e", "generation", "edition", "workstation", "server", "laptop", "gpu"),
        *("max", "q", "mobile", "sff", "blackwell", "oem", "dgx"),
    }
)
_SIZE_WORD = re.compile(r"[0-9]+(gb|g|mb)")
_MIG_SUFFIX = re.compile(r"\s+MIG\s+\S+\s*$", re.IGNORECASE)


@lru_cache(maxsize=1024)
def gpu_type(nvml_name: str) -> str:
    """The GPU type (what `--gpus TYPE:N` and `--constraint TYPE` name) of a unit NVML calls
    `nvml_name`: the model, without vendor, line, board or memory words, in lower case.

    "NVIDIA A100-SXM4-80GB" and "NVIDIA A100-PCIE-40GB" are "a100", "NVIDIA H100 80GB HBM3"
    "h100", "NVIDIA RTX A6000" "a6000", "NVIDIA RTX 6000 Ada Generation" "rtx6000ada",
    "NVIDIA GeForce RTX 4090" "rtx4090"; a MIG slice ("NVIDIA H200 MIG 3g.71gb") has its GPU's
    type. One model is one type whatever its board: SXM and PCIe cards differ in speed, not in
    what runs on them, and memory has its own request (--gpu-mem). An unknown name gives its
    words run together ("Foo Bar 9" -> "foobar9"); an empty one "unknown".
    """
    text = _MIG_SUFFIX.sub("", nvml_name or "")
    words = [re.sub(r"[^a-z0-9.]", "", w) for w in re.split(r"[\s\-_/()]+", text.lower())]
    words = [w for w in words if w]
    words = [w for w in words if w not in _VENDOR_WORDS]
    words = [w for w in words if w not in _NOISE_WORDS and not _SIZE_WORD.fullmatch(w)]
    if len(words) > 1 and words[0] == "rtx" and re.fullmatch(r"[a-z]+[0-9]+", words[1]):
        words = words[1:]  # "RTX A6000": the model is A6000 (the RTX is its line)
    token = re.sub(r"[^a-z0-9._-]", "", "".join(words))
    token = token.lstrip("._-")[:32]
    return token if GPU_TYPE_RE.fullmatch(token) else "unknown"


def check_gpu_type(value: object) -> str:
    """A GPU type as a user may write it: lower case letters, digits, `.`, `_`, `-`."""
    if not isinstance(value, str) or not GPU_TYPE_RE.fullmatch(value):
        raise InvalidInput(
            "--gpus",
            shown(value),
            "a GPU type is a model name such as a100, h100 or l40s (see gpuq nodes)",
        )
    return value


def parse_gpu_request(text: str, flag: str = "--gpus") -> tuple[str | None, int]:
    """`N`, `TYPE:N` or `TYPE` (sbatch's --gpus: a type alone is one GPU of it, as in SLURM,
    where `--gpus-per-node=a100` and `--gres=gpu:a100` are one a100), as (type, count). A type
    is normalised as NVML names are (`A100` and `a100-sxm4` are a100), so a user may type the
    model as the card says."""
    raw = text.strip()
    kind, colon, count = raw.rpartition(":")
    if not colon and raw[:1].isalpha():
        kind, count = raw, "1"
    elif not colon:
        kind, count = "", raw
    if not re.fullmatch(r"\+?[0-9]{1,6}", count.strip()):
        raise InvalidInput(flag, shown(text), "expected N, TYPE:N or TYPE (e.g. 2, a100:2, a100)")
    if not kind and not colon:
        return None, int(count)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9 ._-]{0,63}", kind.strip()):
        raise InvalidInput(
            flag,
            shown(text),
            "expected N, TYPE:N or TYPE, TYPE a model such as a100 (see gpuq nodes)",
        )
    return check_gpu_type(gpu_type(kind.strip())), int(count)
