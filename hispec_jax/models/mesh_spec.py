"""Device-mesh shapes as text (`data=2,model=4`), checked without JAX.

The command line parses `--mesh` with these functions before JAX is imported, so a typo
fails in milliseconds; the device count is checked once JAX is up (`sharding.make_mesh`).
This module imports nothing but the standard library.

Mesh axes (`sharding.RULES` maps the model's logical axes onto them):

    data    splits the batch: each data shard decodes its own sequences
    model   tensor parallelism: attention heads, KV heads, MLP width, vocabulary
"""

from __future__ import annotations

MESH_AXES = ("data", "model")


class MeshSpecError(ValueError):
    """A bad mesh text: `text` as given and `reason` (what is wrong, without the text)."""

    def __init__(self, text, reason: str):
        self.text, self.reason = text, reason
        super().__init__(f"mesh {text!r}: {reason}")


def parse_mesh(text: str) -> dict[str, int]:
    """`"data=2,model=4"` -> `{"data": 2, "model": 4}`; axes not named have size 1.

    Raises `MeshSpecError` (a ValueError) naming the bad entry (unknown axis, repeated
    axis, size not an integer >= 1, missing `=`)."""
    if not isinstance(text, str) or not text.strip():
        raise MeshSpecError(text, f"expected AXIS=SIZE[,AXIS=SIZE] with axes "
                                  f"{'/'.join(MESH_AXES)} (e.g. data=2,model=4)")
    shape = {}
    for entry in text.split(","):
        name, sep, size = (part.strip() for part in entry.partition("="))
        if not sep or not name:
            raise MeshSpecError(text, f"entry {entry.strip()!r} is not AXIS=SIZE "
                                      "(e.g. data=2,model=4)")
        if name not in MESH_AXES:
            raise MeshSpecError(text, f"unknown axis {name!r} (axes: {', '.join(MESH_AXES)})")
        if name in shape:
            raise MeshSpecError(text, f"axis {name!r} is given twice")
        if not size.isdigit() or int(size) < 1:
            raise MeshSpecError(text, f"size of {name!r} must be an integer >= 1, got {size!r}")
        shape[name] = int(size)
    return {axis: shape.get(axis, 1) for axis in MESH_AXES}


def mesh_text(shape: dict[str, int]) -> str:
    """`{"data": 2, "model": 4}` -> `"data=2,model=4"` (the inverse of `parse_mesh`)."""
    return ",".join(f"{axis}={shape.get(axis, 1)}" for axis in MESH_AXES)


def mesh_size(shape: dict[str, int]) -> int:
    """Devices the mesh needs: the product of its axis sizes."""
    size = 1
    for axis in MESH_AXES:
        size *= shape.get(axis, 1)
    return size


def check_device_count(shape: dict[str, int], device_count: int, platform: str = "") -> None:
    """Raises `MeshSpecError` unless the axis sizes multiply to exactly `device_count`."""
    need = mesh_size(shape)
    if need != device_count:
        where = f" {platform}" if platform else ""
        raise MeshSpecError(mesh_text(shape),
                            f"needs {need} devices (the product of its axis sizes) but "
                            f"{device_count}{where} device{'s are' if device_count != 1 else ' is'}"
                            " available; the sizes must multiply to the device count")
