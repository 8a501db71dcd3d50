#!/usr/bin/env python3
"""bench/gpu_profile_table.py on two small traces written as cnnflow's
Tracer and torch.profiler write them: the classes, the nesting of a
convolution's backward-data and backward-weights in its backward, the idle
gaps and the per-step division."""
import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import gpu_profile_table as gpt  # noqa: E402


def span(name, cat, ts, dur, tid):
    return {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur, "pid": 0, "tid": tid}


def cnnflow_trace():
    lane = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": 7, "args": {"name": "cuda:0"}},
            {"name": "thread_name", "ph": "M", "pid": 0, "tid": 1, "args": {"name": "thread 1"}}]
    events = []
    for step, t in enumerate((0, 1000)):  # two steps, 1000 us apart
        events += [
            span("replica 0", "step", t, 900, 1),
            span("conv1 (conv2d)", "gpu forward", t, 100, 7),
            span("bn1 (batchnorm)", "gpu forward", t + 100, 50, 7),
            span("relu1 (relu)", "gpu forward", t + 150, 10, 7),
            span("fc (linear)", "gpu forward", t + 160, 40, 7),
            # the conv's backward: 300 us, of which 120 data and 150 weights
            span("conv1 (conv2d)", "gpu backward", t + 300, 300, 7),
            span("conv1 (conv2d)", "gpu backward-data", t + 310, 120, 7),
            span("conv1 (conv2d)", "gpu backward-weights", t + 440, 150, 7),
            span("optimizer step", "gpu optimizer", t + 700, 100, 7),
            # host spans: not on a GPU lane
            span("conv1 (conv2d)", "forward", t, 5, 1),
        ]
    return {"traceEvents": lane + events}


def torch_trace():
    events = []
    for step, t in enumerate((0, 2000)):
        events += [
            span(f"ProfilerStep#{step}", "user_annotation", t, 1900, 1),
            span("sm90_xmma_fprop_implicit_gemm_f32f32_tf32", "kernel", t, 200, 9),
            span("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float>", "kernel", t + 200, 100, 9),
            span("sm80_xmma_dgrad_implicit_gemm", "kernel", t + 400, 240, 9),
            span("sm80_xmma_wgrad_implicit_gemm", "kernel", t + 700, 300, 9),
            span("void at::native::multi_tensor_apply_kernel<...>", "kernel", t + 1100, 200, 9),
            span("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", t + 1400, 50, 9),
            span("volta_sgemm_128x64_nn", "kernel", t + 1500, 80, 9),
            span("aten::conv2d", "cpu_op", t, 50, 1),  # a host op: not a kernel
        ]
    return {"traceEvents": events}


def table(**files):
    with tempfile.TemporaryDirectory() as d:
        argv = []
        for side, trace in files.items():
            path = os.path.join(d, side + ".json")
            with open(path, "w") as f:
                json.dump(trace, f)
            argv += ["--" + side, path]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            gpt.main(argv)
    rows = {}
    for line in out.getvalue().splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


class GpuProfileTableTest(unittest.TestCase):
    def test_cnnflow_classes_per_step(self):
        rows = table(cnnflow=cnnflow_trace())
        self.assertEqual(rows["conv forward"], ["0.10"])
        self.assertEqual(rows["conv backward-data"], ["0.12"])
        self.assertEqual(rows["conv backward-weights"], ["0.15"])
        # the backward's own time, its nested passes taken out
        self.assertEqual(rows["conv backward (other)"], ["0.03"])
        self.assertEqual(rows["batch norm"], ["0.05"])
        self.assertEqual(rows["elementwise"], ["0.01"])
        self.assertEqual(rows["matmul"], ["0.04"])
        self.assertEqual(rows["optimizer"], ["0.10"])
        # GPU lane from 0 to 1800 us, 2 x 600 us covered: 600 us idle over 2 steps
        self.assertEqual(rows["idle"], ["0.30"])
        self.assertEqual(rows["step (kernels + idle)"], ["0.90"])

    def test_torch_kernels_and_the_ratio(self):
        rows = table(cnnflow=cnnflow_trace(), torch=torch_trace())
        self.assertEqual(rows["conv forward"], ["0.10", "0.20", "0.50x"])
        self.assertEqual(rows["conv backward-data"], ["0.12", "0.24", "0.50x"])
        self.assertEqual(rows["conv backward-weights"], ["0.15", "0.30", "0.50x"])
        self.assertEqual(rows["batch norm"], ["0.05", "0.10", "0.50x"])
        self.assertEqual(rows["optimizer"], ["0.10", "0.20", "0.50x"])
        self.assertEqual(rows["copy"], ["0.00", "0.05", "0.00x"])
        self.assertEqual(rows["matmul"], ["0.04", "0.08", "0.50x"])
        # kernels from 0 to 3580 us, 2 x 1170 us covered
        self.assertEqual(rows["idle"][1], "0.62")

    def test_steps_override(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.json")
            with open(path, "w") as f:
                json.dump(torch_trace(), f)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                gpt.main(["--torch", path, "--steps", "4"])
        self.assertIn("| conv forward | 0.10 |", out.getvalue())


if __name__ == "__main__":
    unittest.main()
