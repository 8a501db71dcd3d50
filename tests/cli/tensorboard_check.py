"""Reads a cnnflow run folder's event file with TensorBoard's own reader and
checks it against metrics.csv.

usage: tensorboard_check.py RUN_DIR EPOCHS STEP,STEP,... test|notest [ranks]
(ranks: the run had several replicas, so each epoch has ranks/* scalars)
"""
import csv
import math
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

run, epochs, steps, test = sys.argv[1], int(sys.argv[2]), [int(s) for s in sys.argv[3].split(",")], sys.argv[4] == "test"
ranks = sys.argv[5:] == ["ranks"]
acc = EventAccumulator(run)
acc.Reload()
tags = set(acc.Tags()["scalars"])
print(run, "scalars:", sorted(tags))

step_tags = {"train/loss", "train/accuracy", "train/lr", "train/images_per_s",
             "train/data_wait_share", "train/allreduce_share"}
epoch_tags = {"epoch/train_loss", "epoch/train_accuracy", "epoch/lr", "epoch/images_per_s",
              "epoch/data_wait_share", "epoch/allreduce_share"}
test_tags = {"epoch/test_loss", "epoch/test_accuracy"}
rank_tags = {f"ranks/{phase}_ms_{stat}" for phase in ("data", "forward", "backward", "allreduce", "optimizer")
             for stat in ("median", "max")}
want = step_tags | epoch_tags | (test_tags if test else set()) | (rank_tags if ranks else set())
assert tags == want, f"tags {sorted(tags)}, expected {sorted(want)}"

for tag in step_tags:
    got = [e.step for e in acc.Scalars(tag)]
    assert got == steps, f"{tag}: steps {got}, expected {steps}"
for tag in ("train/data_wait_share", "train/allreduce_share"):
    for e in acc.Scalars(tag):
        assert 0 <= e.value <= 1, f"{tag} at step {e.step}: {e.value} is no share"
for e in acc.Scalars("train/loss"):
    assert 0 < e.value < 5, f"train/loss at step {e.step}: {e.value}"

rows = list(csv.DictReader(open(f"{run}/metrics.csv")))
assert len(rows) == epochs, f"{len(rows)} rows in metrics.csv"
columns = {"epoch/train_loss": "train_loss", "epoch/train_accuracy": "train_accuracy",
           "epoch/lr": "lr", "epoch/images_per_s": "images_per_s"}
if test:
    columns |= {"epoch/test_loss": "test_loss", "epoch/test_accuracy": "test_accuracy"}
else:
    assert all(r["test_loss"] == "" for r in rows), "a test loss without a test set"
for tag, column in columns.items():
    events = acc.Scalars(tag)
    assert [e.step for e in events] == list(range(1, epochs + 1)), f"{tag}: steps {[e.step for e in events]}"
    for e, r in zip(events, rows):
        # simple_value is a float32; the CSV has 6 decimals (images/s 1).
        ref = float(r[column])
        assert math.isclose(e.value, ref, rel_tol=1e-5, abs_tol=1e-6 if column != "images_per_s" else 0.06), \
            f"{tag} at epoch {e.step}: {e.value}, metrics.csv {ref}"
for tag in rank_tags & want:
    events = acc.Scalars(tag)
    assert [e.step for e in events] == list(range(1, epochs + 1)), f"{tag}: steps {[e.step for e in events]}"
    assert all(0 <= e.value < 10000 for e in events), f"{tag}: {[e.value for e in events]} ms per step"
    if tag.endswith("_median"):
        for e, m in zip(events, acc.Scalars(tag[:-len("median")] + "max")):
            assert e.value <= m.value, f"{tag} at epoch {e.step}: {e.value} above the max {m.value}"
# steps.csv (what cnnflow plot reads): the same step points, and each
# epoch's test loss on a row of its own.
steps_rows = list(csv.DictReader(open(f"{run}/steps.csv")))
train_rows = [r for r in steps_rows if r["train_loss"] != ""]
assert [int(r["step"]) for r in train_rows] == steps, [r["step"] for r in train_rows]
for tag, column in (("train/loss", "train_loss"), ("train/accuracy", "train_accuracy"),
                    ("train/lr", "lr"), ("train/data_wait_share", "data_wait_share")):
    for e, r in zip(acc.Scalars(tag), train_rows):
        assert math.isclose(e.value, float(r[column]), rel_tol=1e-6, abs_tol=1e-7), (tag, e, r)
test_rows = [r for r in steps_rows if r["test_loss"] != ""]
assert len(test_rows) == (epochs if test else 0), test_rows
for r, m in zip(test_rows, rows):
    assert math.isclose(float(r["test_loss"]), float(m["test_loss"]), rel_tol=1e-5), (r, m)
print(f"ok: {len(want)} tags, steps {steps}, epochs 1..{epochs} equal to metrics.csv")
