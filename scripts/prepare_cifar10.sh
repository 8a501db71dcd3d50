#!/usr/bin/env bash
# CIFAR-10 under data/ (git-ignored), from a local file or the official site.
#   scripts/prepare_cifar10.sh            download cifar-10-binary.tar.gz from the
#                                         official site, check its SHA-256, extract
#                                         data/cifar-10-batches-bin/ (configs/cifar10_binary.yaml)
#   scripts/prepare_cifar10.sh FILE       FILE is one of:
#     cifar-10-binary.tar.gz (the official binary version; its SHA-256 is checked
#       too) -> data/cifar-10-batches-bin/, read by `source: cifar`
#     a CIFAR-10 JPEG set (cifar10-jpeg/{train,test}/<class>/<n>.jpg, e.g. this
#       machine's ../shared/data/cifar10-jpeg.tar.gz; no published checksum) ->
#       data/cifar10-{train,test}.lmdb (encoded JPEG, configs/cifar10.yaml)
# CNNFLOW_DATA_DIR: another folder than data/; CNNFLOW=path of the cnnflow binary.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/fetch.sh
# https://www.cs.toronto.edu/~kriz/cifar.html, "CIFAR-10 binary version (suitable
# for C programs)", 170052171 bytes. The site publishes its MD5
# (c32a1d4ab5d03f1284b67883e8d87530); this SHA-256 of the same file is the one
# TensorFlow Datasets pins (tensorflow_datasets/url_checksums/cifar10.txt).
url=${CNNFLOW_CIFAR10_URL:-https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz}
sha256=${CNNFLOW_CIFAR10_SHA256:-c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd}
data=${CNNFLOW_DATA_DIR:-data}
cnnflow=${CNNFLOW:-build/cnnflow}
mkdir -p "$data"

file=${1:-}
if [[ -z "$file" ]]; then
  file="$data/downloads/cifar-10-binary.tar.gz"
  fetch_verified "$url" "$sha256" "$file"
fi
[[ -f "$file" ]] || { echo "error: no file '$file'" >&2; exit 1; }
case "$(tar_top "$file")" in
  cifar-10-batches-bin)
    verify_sha256 "$file" "$sha256"
    tmp=$(mktemp -d "$data/.cifar10.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    tar xzf "$file" -C "$tmp"
    rm -rf "$data/cifar-10-batches-bin"
    mv "$tmp/cifar-10-batches-bin" "$data/cifar-10-batches-bin"
    echo "CIFAR-10 binary batches in $data/cifar-10-batches-bin:" \
         "$(ls "$data/cifar-10-batches-bin" | grep -c '\.bin$') files (configs/cifar10_binary.yaml)"
    ;;
  cifar10-jpeg)
    [[ -d "$data/cifar10-jpeg" ]] || tar xzf "$file" -C "$data"
    "$cnnflow" convert --from folder "$data/cifar10-jpeg/train" --to "$data/cifar10-train.lmdb" --shuffle --overwrite
    "$cnnflow" convert --from folder "$data/cifar10-jpeg/test" --to "$data/cifar10-test.lmdb" --overwrite
    ;;
  cifar-10-batches-py)
    echo "error: $file is CIFAR-10's Python version (pickles); cnnflow reads the binary" \
         "version, cifar-10-binary.tar.gz" >&2
    exit 1
    ;;
  *)
    echo "error: $file is neither cifar-10-binary.tar.gz nor a cifar10-jpeg set" >&2
    exit 1
    ;;
esac
