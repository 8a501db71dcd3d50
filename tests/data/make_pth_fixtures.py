"""Writes tests/data/pth/: small files PyTorch's torch.save wrote, for the
.pth reader's tests (tests/ops/io/pth_test.cc, tests/pipeline/pth_init_test.cc)
and the fuzz seeds (fuzz/corpus/pth/, fuzz/make_corpus.py copies them).

Each .pth whose tensors the tests read has a .safetensors beside it holding
the same tensors, written by the safetensors package: contiguous, with the
integer and bool tensors widened to int64 as the reader returns them. The
tests compare the two byte for byte, so no value is written into a test.

  dtypes.pth            a dict of seeded tensors: float32/64, float16,
                        bfloat16, int64 (a scalar, as BatchNorm's
                        num_batches_tracked), int32, int16, int8, uint8, bool,
                        a transposed view, a view at an offset into a larger
                        storage, and two views sharing one storage
  deflated.pth          dtypes.pth's entries re-zipped, deflated (Python's
                        zipfile); same tensors
  nocrc.pth             the same dict saved with torch.serialization.
                        set_crc32_options(False): no CRC-32 recorded (the
                        fuzz seed whose mutations reach the pickle)
  wrapped_state_dict.pth  {"state_dict": {...}, "epoch": 3, "arch": "tiny"}
  wrapped_model.pth     {"model": {...}, "optimizer": SGD's state_dict(),
                        "epoch": 3}, as a training script saves it
  ddp.pth               nn.DataParallel(...).state_dict(): "module." names
                        (the .safetensors of wrapped_*.pth and ddp.pth is
                        module.safetensors: the same module's tensors)
  pytorch_tiny.pth      tests/data/pytorch_tiny.safetensors saved by
                        torch.save (a DataParallel state_dict), for the
                        train.init test
  legacy.pth            _use_new_zipfile_serialization=False (torch < 1.6)
  forbidden_system.pth  torch's zip layout around a pickle, by Python's pickle
                        module, that would call os.system
  forbidden_eval.pth    the same with builtins.eval
  protocol4.pth         a plain dict pickled with protocol 4 (FRAME,
                        SHORT_BINUNICODE: opcodes torch's weights-only
                        unpickler refuses too)

Not run in CI (no PyTorch there); rerun by hand:
    bench/torch_venv.sh --install
    .venv-torch/bin/python tests/data/make_pth_fixtures.py
"""
import collections
import os
import pickle
import zipfile

import torch
import torch.nn as nn
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "pth")


def path(name):
    return os.path.join(OUT, name)


def as_read(tensors):
    """What the reader returns for each tensor: contiguous; integers and
    bool widened to int64."""
    keep = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64)
    return {k: (v if v.dtype in keep else v.to(torch.int64)).clone(memory_format=torch.contiguous_format)
            for k, v in tensors.items()}


def dtypes():
    g = torch.Generator().manual_seed(57)
    big = torch.randn(5, 4, generator=g)
    shared = torch.randn(6, generator=g)
    d = collections.OrderedDict()
    d["f32"] = torch.randn(2, 3, generator=g)
    d["f64"] = torch.randn(3, generator=g, dtype=torch.float64)
    d["f16"] = torch.randn(4, generator=g).half()
    d["bf16"] = torch.randn(2, 2, generator=g).bfloat16()
    d["bn.num_batches_tracked"] = torch.tensor(1234567890123, dtype=torch.int64)
    d["i64"] = torch.tensor([-(2**40), 0, 2**40 + 7], dtype=torch.int64)
    d["i32"] = torch.tensor([-7, 2**31 - 1], dtype=torch.int32)
    d["i16"] = torch.tensor([-300, 300], dtype=torch.int16)
    d["i8"] = torch.tensor([-128, 127], dtype=torch.int8)
    d["u8"] = torch.tensor([0, 200, 255], dtype=torch.uint8)
    d["bool"] = torch.tensor([True, False, True])
    d["transposed"] = big.t()  # [4, 5], stride (1, 4)
    d["offset_view"] = big[2:4, 1:3]  # offset 9, stride (4, 1)
    d["shared_a"] = shared[:3]
    d["shared_b"] = shared[2:]
    d["empty"] = torch.zeros(0, 3)
    return d


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)
        self.bn = nn.BatchNorm2d(2)
        self.fc = nn.Linear(2, 3)


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(57)

    d = dtypes()
    torch.save(d, path("dtypes.pth"))
    save_file(as_read(d), path("dtypes.safetensors"))
    torch.serialization.set_crc32_options(False)
    torch.save(d, path("nocrc.pth"))
    torch.serialization.set_crc32_options(True)
    with zipfile.ZipFile(path("dtypes.pth")) as src, zipfile.ZipFile(
            path("deflated.pth"), "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            name = "deflated/" + info.filename.split("/", 1)[1]
            dst.writestr(name, src.read(info.filename))

    net = Tiny()
    net.bn.running_mean.uniform_(-1, 1)
    net.bn.running_var.uniform_(0.5, 2)
    net.bn.num_batches_tracked.fill_(9)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    net.fc(net.conv.weight.new_ones(1, 2)).sum().backward()
    opt.step()
    sd = net.state_dict()
    save_file(as_read(sd), path("module.safetensors"))
    torch.save({"state_dict": sd, "epoch": 3, "arch": "tiny"}, path("wrapped_state_dict.pth"))
    torch.save({"model": sd, "optimizer": opt.state_dict(), "epoch": 3}, path("wrapped_model.pth"))
    torch.save(nn.DataParallel(net).state_dict(), path("ddp.pth"))

    tiny = load_file(os.path.join(HERE, "pytorch_tiny.safetensors"))
    torch.save(collections.OrderedDict(tiny), path("pytorch_tiny.pth"))

    torch.save(sd, path("legacy.pth"), _use_new_zipfile_serialization=False)

    class System:
        def __reduce__(self):
            return (os.system, ("echo cnnflow ran code from a pickle",))

    class Eval:
        def __reduce__(self):
            return (eval, ("print('cnnflow ran code from a pickle')",))

    for name, obj, protocol in (("forbidden_system", {"w": System()}, 2),
                                ("forbidden_eval", {"w": Eval()}, 2),
                                ("protocol4", {"w": 1}, 4)):
        with zipfile.ZipFile(path(name + ".pth"), "w") as z:
            z.writestr(name + "/data.pkl", pickle.dumps(obj, protocol=protocol))
            z.writestr(name + "/version", "3\n")
            z.writestr(name + "/byteorder", "little")

    # torch's own weights-only loader reads the good ones and refuses the rest.
    for name in ("dtypes", "deflated", "nocrc", "wrapped_state_dict", "wrapped_model", "ddp",
                 "pytorch_tiny"):
        torch.load(path(name + ".pth"), weights_only=True)
    for name in ("forbidden_system", "forbidden_eval", "protocol4"):
        try:
            torch.load(path(name + ".pth"), weights_only=True)
            raise SystemExit(name + ".pth: torch.load(weights_only=True) read it")
        except pickle.UnpicklingError:
            pass
    for name in sorted(os.listdir(OUT)):
        print(f"{os.path.getsize(path(name)):8d}  tests/data/pth/{name}")


if __name__ == "__main__":
    main()
