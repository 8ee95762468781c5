"""The one owner of the device mesh: parallel degrees, their check against the world, named sub-meshes.

``ParallelDims`` is a frozen value (the sizes of the axes ``pp``, ``dp_replicate``, ``dp_shard``, ``cp``,
``tp``, outermost first, so that tensor parallel peers are neighbouring ranks). ``ParallelMesh`` builds
one ``DeviceMesh`` from it with only the axes larger than 1, plus the flattened axes the strategies ask
for (``dp`` = replicate x shard, ``dp_shard_cp`` = what FSDP shards over, ``dp_cp``), and answers every
"which rank am I along axis X" question, 0 of 1 for an axis that is not there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

#: mesh axes, outermost first
AXES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
#: flattened axes: name -> the axes it joins
FLATTENED = {"dp": ("dp_replicate", "dp_shard"), "dp_shard_cp": ("dp_shard", "cp"),
             "dp_cp": ("dp_replicate", "dp_shard", "cp"),
             # the processes that hold the same pipeline stage (built only with a pp axis)
             "dp_cp_tp": ("dp_replicate", "dp_shard", "cp", "tp")}


@dataclass(frozen=True, slots=True)
class ParallelDims:
    """The size of each mesh axis; their product is the number of processes."""

    dp_replicate: int = 1
    dp_shard: int = 1
    cp: int = 1
    tp: int = 1
    pp: int = 1

    @classmethod
    def from_sizes(cls, sizes: dict[str, int], world_size: int) -> ParallelDims:
        """Check ``sizes`` (axis name -> size, one of them may be -1) against ``world_size``; every problem
        is reported at once in one ValueError."""
        problems = check_sizes(sizes, world_size)
        if problems:
            raise ValueError("invalid parallelism sizes:\n  - " + "\n  - ".join(problems))
        return cls(**fill_sizes(sizes, world_size))

    def size(self, axis: str) -> int:
        """The size of a mesh axis or a flattened axis (1 for one that is not there)."""
        return math.prod(getattr(self, a) for a in FLATTENED.get(axis, (axis,)))

    @property
    def world_size(self) -> int:
        """The product of the axis sizes."""
        return math.prod(getattr(self, a) for a in AXES)

    @property
    def shards_parameters(self) -> bool:
        """Whether FSDP2 shards parameters (over dp_shard x cp)."""
        return self.dp_shard * self.cp > 1

    @property
    def enabled_axes(self) -> tuple[str, ...]:
        """The axes whose size is above 1."""
        return tuple(a for a in AXES if getattr(self, a) > 1)

    def describe(self) -> str:
        """The axes above 1 as text, e.g. ``dp_shard=2 x tp=2`` (``one process`` when none)."""
        return " x ".join(f"{a}={getattr(self, a)}" for a in AXES if getattr(self, a) > 1) or "one process"


def fill_sizes(sizes: dict[str, int], world_size: int) -> dict[str, int]:
    """``sizes`` with its one -1 replaced by what the others leave of ``world_size`` (assumes it is valid)."""
    known = math.prod(v for v in sizes.values() if v != -1)
    return {k: (world_size // max(known, 1) if v == -1 else v) for k, v in sizes.items()}


def check_sizes(sizes: dict[str, int], world_size: int) -> list[str]:
    """Every problem with the axis sizes, each naming the value given and what to do."""
    problems = []
    unknown = sorted(set(sizes) - set(AXES))
    if unknown:
        problems.append(f"unknown mesh axes {unknown}; valid axes: {list(AXES)}")
    bad = {k: v for k, v in sizes.items() if not isinstance(v, int) or isinstance(v, bool) or (v < 1 and v != -1)}
    for axis, value in bad.items():
        problems.append(f"{axis}_size={value!r} is not valid; give an integer >= 1, or -1 to fill in")
    fills = [k for k, v in sizes.items() if v == -1]
    if len(fills) > 1:
        problems.append(f"only one size may be -1, got -1 for {', '.join(f'{k}_size' for k in fills)}")
    if bad or len(fills) > 1 or unknown:
        return problems
    product = math.prod(v for v in sizes.values() if v != -1)
    shown = " x ".join(f"{k}_size={v}" for k, v in sizes.items() if v != 1)
    if fills:
        if world_size % product:
            problems.append(f"{shown}: the product of the other sizes ({product}) does not divide the "
                            f"{world_size} processes, so {fills[0]}_size=-1 cannot be filled in")
    elif product != world_size:
        problems.append(f"{shown or 'all sizes 1'}: the product is {product} but there are {world_size} "
                        "processes; make the product equal the number of processes (or give one size as -1)")
    return problems


class ParallelMesh:
    """The job's ``DeviceMesh`` and this process's place along each of its axes.

    Built once per ``Accelerator`` (after the process group exists). With one process, or no axis
    larger than 1, there is no mesh and every axis answers rank 0 of size 1::

        mesh = ParallelMesh(ParallelDims(dp_shard=2, tp=2), "cpu")
        mesh["tp"]            # the 1-D tensor-parallel sub-mesh of this process
        mesh.rank("dp")       # this process's data-parallel index (0 or 1)
    """

    def __init__(self, dims: ParallelDims, device_type: str, global_rank: int = 0, build: bool = True,
                 output_pp_rank: int | None = None) -> None:
        self.dims = dims
        self.device_type = device_type
        #: the pipeline rank whose outputs count when results are gathered (the one holding the last stage:
        #: 0 for a V-shaped schedule)
        self.output_pp_rank = dims.pp - 1 if output_pp_rank is None else output_pp_rank
        self.mesh: Any = None
        self._named: dict[str, Any] = {}
        # Ranks are laid out row-major over AXES (as init_device_mesh does): coordinates need no mesh.
        self._coordinate: dict[str, int] = {}
        rest = global_rank
        for axis in reversed(AXES):
            rest, self._coordinate[axis] = divmod(rest, getattr(dims, axis))
        if build and dims.world_size > 1:
            self._build()

    def _build(self) -> None:
        # lazy: the sizes are checked without torch.distributed; only a built mesh needs it
        from torch.distributed.device_mesh import init_device_mesh

        axes = self.dims.enabled_axes
        self.mesh = init_device_mesh(self.device_type, tuple(getattr(self.dims, a) for a in axes),
                                     mesh_dim_names=axes)
        self._named = {axis: self.mesh[axis] for axis in axes}
        for name, parts in FLATTENED.items():
            present = tuple(a for a in parts if a in axes)
            if name == "dp_cp_tp" and "pp" not in axes:
                continue  # only a pipeline asks for it: no extra process group otherwise
            if len(present) == 1:
                self._named[name] = self._named[present[0]]
            elif present:
                # torch asks callers to keep flattened meshes themselves: this object is their owner.
                self._named[name] = self.mesh[present]._flatten(name)

    def __getitem__(self, axis: str) -> Any:
        """The sub-mesh along ``axis`` (a mesh axis or a flattened one); KeyError when it is size 1."""
        if axis not in self._named:
            valid = sorted(self._named) or ["none: no axis is larger than 1"]
            raise KeyError(f"the device mesh has no axis {axis!r} larger than 1; axes: {valid}")
        return self._named[axis]

    def get(self, axis: str) -> Any:
        """The sub-mesh along ``axis``, or None when that axis is size 1."""
        return self._named.get(axis)

    def size(self, axis: str) -> int:
        """The size of ``axis`` or of a flattened axis (1 when it is not there)."""
        return self.dims.size(axis)

    def rank(self, axis: str) -> int:
        """This process's index along ``axis`` (0 when the axis is size 1)."""
        index = 0
        for part in FLATTENED.get(axis, (axis,)):
            index = index * getattr(self.dims, part) + self._coordinate[part]
        return index

    def fsdp_mesh(self) -> Any:
        """The mesh FSDP2 works over: (dp_replicate, dp_shard_cp) for HSDP, dp_shard_cp for FSDP."""
        shard = self._named.get("dp_shard_cp")
        replicate = self._named.get("dp_replicate")
        if shard is None or replicate is None:
            return shard
        if self.dims.cp == 1:
            return self.mesh["dp_replicate", "dp_shard"]
        from torch.distributed.device_mesh import DeviceMesh  # lazy: as in _build

        # A 2-D view whose rows are replicas and columns shards: built from the global mesh's rank layout.
        ranks = self.mesh.mesh
        names = self.mesh.mesh_dim_names
        keep = [names.index(a) for a in ("dp_replicate", "dp_shard", "cp") if a in names]
        drop = [i for i in range(len(names)) if i not in keep]
        coordinate = self.mesh.get_coordinate()
        index = tuple(coordinate[i] if i in drop else slice(None) for i in range(len(names)))
        grid = ranks[index].reshape(self.dims.dp_replicate, -1)
        return DeviceMesh.from_group([replicate.get_group(), shard.get_group()], self.device_type,
                                     mesh=grid, mesh_dim_names=("dp_replicate", "dp_shard_cp"))

    def owns_output(self) -> bool:
        """Whether this process speaks for its tensor-parallel group when results are gathered (tensor
        parallel peers hold identical outputs: only the first of them contributes; of a pipeline, only the
        rank holding the last stage has outputs)."""
        return self.rank("tp") == 0 and self.rank("pp") == self.output_pp_rank

    def __repr__(self) -> str:
        return f"ParallelMesh({self.dims.describe()}, device_type={self.device_type!r})"
