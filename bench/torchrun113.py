"""Debian's torch 1.13 torchrun, made to start on Python 3.11.

torch 1.13's `Std.from_str("0")` returns None on Python 3.11 (its enum lookup by value breaks), so
torchrun crashes with its default `--redirects 0 --tee 0`. This shim fixes only that function, in this
process, and then runs torchrun unchanged: `/usr/bin/python3 bench/torchrun113.py <torchrun args>`.
No installed file is modified.
"""
import re
import sys

from torch.distributed.elastic.multiprocessing import api

_STD_BY_VALUE = {0: api.Std.NONE, 1: api.Std.OUT, 2: api.Std.ERR, 3: api.Std.ALL}


def _from_str(vm):
    def to_std(v):
        return _STD_BY_VALUE[int(v)]

    if re.match(r"^\d$", vm):
        return to_std(vm)
    if re.match(r"^(\d:\d)(,\d:\d)*$", vm):
        return {int(k): to_std(v) for k, v in (x.split(":") for x in vm.split(","))}
    raise ValueError(f"{vm} does not match: <0|1|2|3> or <LOCAL_RANK:0|1|2|3,...>")


api.Std.from_str = staticmethod(_from_str)

from torch.distributed.run import main  # noqa: E402

if __name__ == "__main__":
    sys.argv[0] = "torchrun"
    main()
