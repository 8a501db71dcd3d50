#!/usr/bin/env python3
"""bench/airbench_pytorch.py's batches and its --json figures, on the CPU
(and on a GPU where torch sees one):
  - crop_flip (the training batch from the padded uint8 set, channels-last)
    equals the per-pixel rule out[b, c, i, j] = padded[idx[b], c, row + i,
    flip ? col + 31 - j : col + j] written out in numpy, and the NCHW gather
    the script used before the GPU path (the same pixels, so the CPU rows
    before and after are one recipe);
  - epoch_draws: the alternating flip (odd epochs invert the base flips),
    offsets in [0, 2 pad], a permutation;
  - pad_images: numpy's reflect padding, channels last;
  - on a GPU (skipped without one): crop_flip on cuda equals the CPU's;
  - end to end on the 20 sample JPEGs of tests/data (2 steps of batch 8):
    --json carries timed_s > 0, decode_s, compile_s == 0 on the CPU without
    --compile, timed_s = train_s + eval_s, device "cpu";
  - warm_up puts the weights, BN buffers and torch's generator back;
  - --precision fp16 with --device cpu is a usage error (exit 2);
  - with AIRBENCH_TEST_COMPILE=1, the same run with --compile (minutes on
    a small CPU): compile_s > 0 and the same accuracy as eager.
Needs torch 2.x and numpy: the interpreter running it, else the venv of
bench/torch_venv.sh ($AIRBENCH_TEST_VENV, default .venv-torch); exits 77
(skipped) when neither has them.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "bench", "airbench_pytorch.py")
SAMPLE = os.path.join(ROOT, "tests", "data", "cifar10-jpeg-sample")


def reexec_with_torch():
    """This interpreter if it has torch, else .venv-torch's; else skip."""
    try:
        import torch  # noqa: F401
        import numpy  # noqa: F401
        return
    except ImportError:
        pass
    venv_py = os.path.join(os.environ.get("AIRBENCH_TEST_VENV", os.path.join(ROOT, ".venv-torch")), "bin", "python")
    # (a venv's python links to the system's: the environment marks the second try)
    if os.path.exists(venv_py) and not os.environ.get("AIRBENCH_TEST_REEXEC"):
        os.environ["AIRBENCH_TEST_REEXEC"] = "1"
        os.execv(venv_py, [venv_py, __file__] + sys.argv[1:])
    print(f"SKIP: no torch 2.x here or in {venv_py} (bench/torch_venv.sh --install)")
    sys.exit(77)


reexec_with_torch()
import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "bench"))
import airbench_pytorch as ab  # noqa: E402


def reference_crop_flip(padded_nchw, idx, shift, flip):
    """The rule, pixel by pixel, in numpy: uint8 [B, 3, 32, 32]."""
    out = np.zeros((len(idx), 3, 32, 32), dtype=np.uint8)
    for b, n in enumerate(idx):
        r0, c0 = shift[b]
        for i in range(32):
            for j in range(32):
                col = c0 + 31 - j if flip[b] else c0 + j
                out[b, :, i, j] = padded_nchw[n, :, r0 + i, col]
    return out


class Batches(unittest.TestCase):
    def setUp(self):
        rng = np.random.default_rng(7)
        self.u8 = rng.integers(0, 256, (12, 3, 32, 32), dtype=np.uint8)
        self.pad = ab.RECIPE["translate"]
        self.padded = ab.pad_images(torch, self.u8, self.pad)  # [N, 36, 36, 3]
        self.idx = torch.tensor([3, 0, 11, 3, 7, 5])
        self.shift = torch.tensor([[0, 0], [4, 4], [2, 1], [1, 3], [4, 0], [0, 4]])
        self.flip = torch.tensor([False, True, True, False, True, False])

    def test_pad_images_is_reflect_channels_last(self):
        want = np.pad(self.u8, ((0, 0), (0, 0), (2, 2), (2, 2)), mode="reflect").transpose(0, 2, 3, 1)
        self.assertEqual(tuple(self.padded.shape), (12, 36, 36, 3))
        np.testing.assert_array_equal(self.padded.numpy(), want)
        # the reflection does not repeat the edge: column -1 is column 1
        np.testing.assert_array_equal(self.padded[:, 2:34, 1].numpy(), self.padded[:, 2:34, 3].numpy())

    def test_crop_flip_follows_the_rule(self):
        x = ab.crop_flip(torch, self.padded, self.idx, self.shift, self.flip, torch.arange(32))
        self.assertEqual(tuple(x.shape), (6, 3, 32, 32))
        self.assertTrue(x.is_contiguous(memory_format=torch.channels_last))
        padded_nchw = self.padded.permute(0, 3, 1, 2).numpy()
        want = reference_crop_flip(padded_nchw, self.idx.numpy(), self.shift.numpy(), self.flip.numpy())
        np.testing.assert_array_equal(x.numpy(), want)

    def test_crop_flip_equals_the_former_nchw_gather(self):
        # bench/airbench_pytorch.py before the GPU path (CPU rows up to 2026-12-07)
        train_pad = torch.from_numpy(np.pad(self.u8, ((0, 0), (0, 0), (2, 2), (2, 2)), mode="reflect"))
        ar, ch = torch.arange(32), torch.arange(3).view(1, 3, 1, 1)
        shifts = torch.zeros(12, 2, dtype=torch.int64)
        flips = torch.zeros(12, dtype=torch.bool)
        idx = torch.tensor([3, 0, 11, 7, 5])  # distinct: one draw per image
        shifts[idx] = torch.tensor([[0, 0], [4, 4], [2, 1], [4, 0], [0, 4]])
        flips[idx] = torch.tensor([False, True, True, True, False])
        rows = shifts[idx, 0:1] + ar
        cols = torch.where(flips[idx, None], shifts[idx, 1:2] + 31 - ar, shifts[idx, 1:2] + ar)
        old = train_pad[idx.view(-1, 1, 1, 1), ch, rows[:, None, :, None], cols[:, None, None, :]]
        new = ab.crop_flip(torch, self.padded, idx, shifts[idx], flips[idx], ar)
        self.assertTrue(torch.equal(old, new))

    def test_epoch_draws_alternate_the_flip(self):
        torch.manual_seed(3)
        base = torch.rand(100) < 0.5
        perm0, shifts0, flip0 = ab.epoch_draws(torch, 100, 2, base, 0)
        _, shifts1, flip1 = ab.epoch_draws(torch, 100, 2, base, 1)
        self.assertTrue(torch.equal(flip0, base))
        self.assertTrue(torch.equal(flip1, ~base))
        self.assertTrue(torch.equal(perm0.sort().values, torch.arange(100)))
        for s in (shifts0, shifts1):
            self.assertEqual(int(s.min()), 0)
            self.assertEqual(int(s.max()), 4)

    def test_warm_up_leaves_the_weights_and_the_draws(self):
        from torch import nn
        import torch.nn.functional as F
        torch.manual_seed(0)
        net = ab.build_net(torch, nn).to(memory_format=torch.channels_last)
        before = {k: v.clone() for k, v in net.state_dict().items()}
        rng = torch.get_rng_state()
        autocast = torch.autocast("cpu", dtype=torch.float32, enabled=False)
        ab.warm_up(torch, F, net, net, torch.device("cpu"), autocast, 4, [3, 2], steps=1)
        self.assertTrue(torch.equal(rng, torch.get_rng_state()))
        self.assertTrue(net.training and net.whiten.bias.requires_grad)
        self.assertFalse(net.whiten.weight.requires_grad or net.group1.norm1.weight.requires_grad)
        for k, v in net.state_dict().items():
            self.assertTrue(torch.equal(v, before[k]), k)
        self.assertTrue(all(p.grad is None for p in net.parameters()))

    @unittest.skipUnless(torch.cuda.is_available(), "GPU: torch sees no CUDA device")
    def test_GPU_crop_flip_equals_the_cpu(self):
        cpu = ab.crop_flip(torch, self.padded, self.idx, self.shift, self.flip, torch.arange(32))
        dev = torch.device("cuda:0")
        gpu = ab.crop_flip(torch, self.padded.to(dev), self.idx.to(dev), self.shift.to(dev),
                           self.flip.to(dev), torch.arange(32, device=dev))
        self.assertTrue(torch.equal(cpu, gpu.cpu()))


def run_script(*extra):
    with tempfile.TemporaryDirectory() as tmp:
        for split in ("train", "test"):
            os.symlink(SAMPLE, os.path.join(tmp, split))
        return subprocess.run([sys.executable, SCRIPT, "--data", tmp, "--subset", "16", "--batch", "8",
                               "--epochs", "1", "--seed", "1", "--threads", "1", "--json", *extra],
                              capture_output=True, text=True, timeout=1800)


class EndToEnd(unittest.TestCase):
    def check(self, p):
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        d = json.loads(p.stdout.strip().splitlines()[-1])
        self.assertEqual(d["device"], "cpu")
        self.assertEqual(d["steps"], 2)
        self.assertGreater(d["timed_s"], 0)
        self.assertAlmostEqual(d["timed_s"], d["train_s"] + d["eval_s"], delta=0.01)
        self.assertGreaterEqual(d["decode_s"], d["data_s"])
        self.assertGreater(d["wall_s"], d["timed_s"] + d["compile_s"])
        self.assertIn("timed span", p.stderr)
        return d

    def test_cpu_json(self):
        d = self.check(run_script())
        self.assertEqual(d["compile_s"], 0)
        self.assertFalse(d["compile"])

    def test_fp16_on_the_cpu_is_refused(self):
        p = run_script("--precision", "fp16")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("fp16 is for --device cuda", p.stderr)

    @unittest.skipUnless(os.environ.get("AIRBENCH_TEST_COMPILE") == "1", "AIRBENCH_TEST_COMPILE=1: minutes")
    def test_cpu_compiled(self):
        eager = self.check(run_script())
        compiled = self.check(run_script("--compile"))
        self.assertTrue(compiled["compile"])
        self.assertGreater(compiled["compile_s"], 0)
        # the warm-up leaves the weights and the draws as they were; the
        # compiled kernels round otherwise: 20 test images, within 3
        self.assertAlmostEqual(compiled["accuracy_tta"], eager["accuracy_tta"], delta=15.0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
