#!/usr/bin/env python3
"""Builds the fuzz seed corpora, fuzz/corpus/<target>/, from real files:
Fashion-MNIST (IDX), CIFAR-10 JPEGs and the spoken digits (WAV) in
../shared/data, the UCR .ts files, PNGs that Debian ships, the project's
configs/ and graphs/, tests/data (with tests/data/pth: files torch.save
wrote). Seeds are cut small (a few KB): a fuzzer mutates a small input
faster, and the parsers' paths do not need big ones.

  fuzz/make_corpus.py [--data DIR]   # DIR: the shared data sets (../shared/data)

Only the standard library; writes nothing outside fuzz/corpus/. The
checkpoint_sidecar seed is not made here: it must match the data file the
target writes, so scripts/fuzz.sh leaves it as committed.
"""
import argparse
import gzip
import io
import json
import os
import struct
import tarfile
import wave

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "fuzz", "corpus")
FASHION = "/usr/share/datasets/fashion-mnist"


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def idx_seeds():
    img = gzip.open(os.path.join(FASHION, "t10k-images-idx3-ubyte.gz")).read()
    lab = gzip.open(os.path.join(FASHION, "t10k-labels-idx1-ubyte.gz")).read()
    for k, gz in ((1, False), (2, True), (3, True)):
        images = struct.pack(">IIII", 0x803, k, 28, 28) + img[16:16 + k * 784]
        labels = struct.pack(">II", 0x801, k) + lab[8:8 + k]
        if gz:
            images, labels = gzip.compress(images, 9, mtime=0), gzip.compress(labels, 9, mtime=0)
        put("idx", f"fashion-{k}{'-gz' if gz else ''}", struct.pack("<H", len(labels)) + labels + images)
    # A crop of 8x8 pixels, so mutations reach the pixel loop quickly.
    images = struct.pack(">IIII", 0x803, 2, 8, 8) + bytes(img[16 + r * 28 + 10 + i] for r in range(8) for i in range(8)) * 2
    labels = struct.pack(">II", 0x801, 2) + lab[8:10]
    put("idx", "fashion-crop8", struct.pack("<H", len(labels)) + labels + images)
    return img


def cnnflow_record(label, shape, encoding, dtype, payload):
    head = b"CFR1" + bytes([1, encoding, dtype, len(shape)]) + struct.pack("<qQ", label, len(payload))
    return head + b"".join(struct.pack("<q", d) for d in shape) + payload


def varint(v):
    out = b""
    v &= (1 << 64) - 1
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def datum(channels, height, width, label, data=None, floats=None, encoded=False, packed=False):
    out = varint(1 << 3) + varint(channels) + varint(2 << 3) + varint(height) + varint(3 << 3) + varint(width)
    if data is not None:
        out += varint(4 << 3 | 2) + varint(len(data)) + data
    out += varint(5 << 3) + varint(label)
    if floats is not None:
        if packed:
            body = b"".join(struct.pack("<f", x) for x in floats)
            out += varint(6 << 3 | 2) + varint(len(body)) + body
        else:
            out += b"".join(varint(6 << 3 | 5) + struct.pack("<f", x) for x in floats)
    if encoded:
        out += varint(7 << 3) + varint(1)
    return out


def jpegs(data_dir, n):
    out = []
    with tarfile.open(os.path.join(data_dir, "cifar10-jpeg.tar.gz")) as t:
        for m in t:
            if m.isfile() and m.name.endswith(".jpg"):
                out.append((os.path.basename(os.path.dirname(m.name)) + "-" + os.path.basename(m.name),
                            t.extractfile(m).read()))
                if len(out) == n:
                    break
    return out


PNGS = [
    "/usr/share/doc/python3/_static/minus.png",             # 8-bit gray
    "/usr/share/gitweb/static/git-favicon.png",             # 2-bit palette
    "/usr/share/gitweb/static/git-logo.png",                # 8-bit palette
    "/usr/share/doc/valgrind/html/images/next.png",         # RGBA
    "/usr/share/cmake-3.25/Templates/Windows/SmallLogo.png",  # gray + alpha
    "/usr/share/gdal/gdalicon.png",                         # RGBA 32x32
]


def image_seeds(data_dir):
    js = jpegs(data_dir, 8)
    for name, b in js:
        put("image", name, b)
    for p in PNGS:
        if os.path.exists(p) and os.path.getsize(p) < 8192:
            put("image", "png-" + os.path.basename(p), open(p, "rb").read())
    return js


def record_seeds(img, js, series):
    pix = img[16:16 + 784]
    put("cnnflow_record", "raw-u8-fashion", cnnflow_record(3, [1, 28, 28], 0, 0, pix))
    put("cnnflow_record", "raw-u8-crop", cnnflow_record(1, [1, 4, 4], 0, 0, pix[300:316]))
    put("cnnflow_record", "raw-f32-series", cnnflow_record(2, [1, len(series)], 0, 1,
                                                            b"".join(struct.pack("<f", x) for x in series)))
    put("cnnflow_record", "jpeg-cifar", cnnflow_record(4, [3, 32, 32], 1, 0, js[0][1]))
    put("cnnflow_record", "jpeg-noshape", cnnflow_record(5, [], 1, 0, js[1][1]))
    png = open(PNGS[0], "rb").read()
    put("cnnflow_record", "png-gray", cnnflow_record(6, [1, 11, 11], 2, 0, png))
    put("caffe_datum", "raw-fashion", datum(1, 28, 28, 3, data=pix))
    put("caffe_datum", "raw-crop", datum(1, 4, 4, 1, data=pix[300:316]))
    put("caffe_datum", "floats-unpacked", datum(1, 1, len(series), 2, floats=series))
    put("caffe_datum", "floats-packed", datum(1, 1, len(series), 2, floats=series, packed=True))
    put("caffe_datum", "jpeg-cifar", datum(3, 32, 32, 4, data=js[0][1], encoded=True))
    put("caffe_datum", "png-encoded", datum(0, 0, 0, 6, data=png, encoded=True))


def ts_seeds(data_dir):
    series = []
    for name in sorted(os.listdir(os.path.join(data_dir, "ucr"))):
        if not name.endswith("_TEST.ts"):  # _TRAIN shares the header: one per problem
            continue
        lines = open(os.path.join(data_dir, "ucr", name), "rb").read().split(b"\n")
        at = next(i for i, l in enumerate(lines) if l.strip().lower().startswith(b"@data"))
        head, cases = lines[:at + 1], [l for l in lines[at + 1:] if l.strip()]
        # The header and the first cases, whole (cutting values would break
        # the lengths the header states).
        for k in (3, 2, 1):  # as many cases as fit in 6 KB
            keep = b"\n".join(head + cases[:k]) + b"\n"
            if len(keep) <= 6000:
                put("ts", name, keep)
                break
        if not series and "GunPoint" in name:
            series = [float(v) for v in cases[0].split(b":")[0].split(b",")[:24]]
    return series or [0.5, -0.25, 1.0]


def wav_seeds(data_dir):
    n = 0
    with tarfile.open(os.path.join(data_dir, "fsdd-spoken-digits.tar.gz")) as t:
        for m in t:
            if not (m.isfile() and m.name.endswith(".wav")):
                continue
            raw = t.extractfile(m).read()
            w = wave.open(io.BytesIO(raw))
            frames = w.readframes(600)  # the first 600 samples (75 ms)
            buf = io.BytesIO()
            o = wave.open(buf, "wb")
            o.setnchannels(w.getnchannels())
            o.setsampwidth(w.getsampwidth())
            o.setframerate(w.getframerate())
            o.writeframes(frames)
            o.close()
            put("wav", os.path.basename(m.name), buf.getvalue())
            n += 1
            if n == 4:
                break
    # The same samples as stereo, and with a LIST chunk before the data.
    w = wave.open(io.BytesIO(buf.getvalue()))
    mono = w.readframes(w.getnframes())
    stereo = b"".join(mono[i:i + 2] * 2 for i in range(0, len(mono), 2))
    b2 = io.BytesIO()
    o = wave.open(b2, "wb")
    o.setnchannels(2)
    o.setsampwidth(2)
    o.setframerate(8000)
    o.writeframes(stereo[:1200])
    o.close()
    put("wav", "stereo.wav", b2.getvalue())
    v = buf.getvalue()
    lst = b"LIST" + struct.pack("<I", 5) + b"INFOx" + b"\0"  # odd size + pad byte
    body = v[12:36] + lst + v[36:]
    put("wav", "list-chunk.wav", b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WAVE" + body)


def text_seeds():
    for folder, target in (("configs", "run_config"), ("graphs", "graph_template")):
        for name in sorted(os.listdir(os.path.join(ROOT, folder))):
            if name.endswith(".yaml"):
                put(target, name, open(os.path.join(ROOT, folder, name), "rb").read())
    put("run_config", "pytorch_tiny.yaml", open(os.path.join(ROOT, "tests/data/pytorch_tiny.yaml"), "rb").read())


def safetensors_seeds():
    def st(tensors, meta=None):
        header, data = {}, b""
        if meta:
            header["__metadata__"] = meta
        for name, dtype, shape, payload in tensors:
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(payload)]}
            data += payload
        h = json.dumps(header, separators=(",", ":")).encode()
        h += b" " * (-len(h) % 8)
        return struct.pack("<Q", len(h)) + h + data

    f32 = b"".join(struct.pack("<f", x) for x in (0.5, -1.0, 2.0, 0.25, 3.0, -0.75))
    put("safetensors", "f32-2x3", st([("fc.weight", "F32", [2, 3], f32), ("fc.bias", "F32", [2], f32[:8])],
                                     {"format": "pt"}))
    put("safetensors", "mixed-dtypes", st([("a", "F64", [2], struct.pack("<dd", 1.5, -2)),
                                            ("b", "F16", [2], b"\x00\x3c\x00\xc0"),
                                            ("c", "BF16", [1, 1], b"\x80\x3f"),
                                            ("d", "F32", [0], b""), ("e", "F32", [], f32[:4])]))
    # The head of PyTorch's own file (tests/data/pytorch_tiny.safetensors):
    # its header and the first tensors; the rest is cut, so sizes disagree.
    real = open(os.path.join(ROOT, "tests/data/pytorch_tiny.safetensors"), "rb").read()
    n = struct.unpack("<Q", real[:8])[0]
    put("safetensors", "pytorch-head", real[:8 + n + 256])
    return real[8:8 + n]


def pth_seeds():
    # The small files torch.save wrote (tests/data/make_pth_fixtures.py):
    # every dtype and view, deflated, a wrapped checkpoint, the legacy format,
    # and pickles torch refuses.
    # nocrc.pth records no CRC-32 (as torch.save can), so mutations of its
    # pickle reach the pickle machine instead of failing the CRC check.
    for name in ("dtypes", "nocrc", "deflated", "wrapped_model", "legacy", "forbidden_system",
                 "protocol4"):
        put("pth", name + ".pth", open(os.path.join(ROOT, "tests/data/pth", name + ".pth"), "rb").read())


def json_seeds(st_header):
    put("json", "pytorch_tiny.json", open(os.path.join(ROOT, "tests/data/pytorch_tiny.json"), "rb").read())
    put("json", "safetensors-header.json", st_header.rstrip())
    put("json", "values.json", json.dumps({"i": -9223372036854775808, "u": 18446744073709551615,
                                            "d": [1e308, -0.0, 5e-324, 0.1], "s": "a\"\\\n\u00e9\ud83d\ude00",
                                            "n": None, "b": [True, False], "o": {}, "a": []}).encode())
    put("json", "nested.json", b"[" * 40 + b"{\"k\": \"\\u0041\"}" + b"]" * 40)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=os.path.join(os.path.dirname(ROOT), "shared", "data"))
    a = ap.parse_args()
    if not os.path.isdir(a.data):
        a.data = "/work/shared/data"
    img = idx_seeds()
    js = image_seeds(a.data)
    series = ts_seeds(a.data)
    record_seeds(img, js, series)
    wav_seeds(a.data)
    text_seeds()
    json_seeds(safetensors_seeds())
    pth_seeds()


if __name__ == "__main__":
    main()
