"""The one-tensor codebook of the token image policies (``ar_image``'s patch centres, ``var_image``'s residual
values): a float32 table whose first dimension is the code, saved in a model folder as one safetensors file."""
from __future__ import annotations

from pathlib import Path

import torch


class TableCodebook:
    """``table`` [K, ...] (float32): code k stands for ``table[k]``. A subclass names its file (:attr:`file`) and
    the tensor's key in it (:attr:`key`), and encodes / decodes images; the base class has neither, so it is never
    saved or loaded itself."""

    file: str  # set by each subclass
    key: str  # set by each subclass

    def __init__(self, table: torch.Tensor):
        self.table = table.float()

    @property
    def size(self) -> int:
        return self.table.shape[0]

    def save(self, path) -> None:
        from safetensors.torch import save_file
        save_file({self.key: self.table.contiguous()}, str(Path(path) / self.file))

    @classmethod
    def load(cls, path) -> "TableCodebook":
        from safetensors.torch import load_file
        return cls(load_file(str(Path(path) / cls.file))[cls.key])
