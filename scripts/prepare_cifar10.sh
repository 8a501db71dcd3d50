#!/usr/bin/env bash
# CIFAR-10 for configs/cifar10.yaml: extracts the JPEG set that ships in
# ../shared/data and converts it to two encoded-JPEG LMDBs under data/.
#   scripts/prepare_cifar10.sh [TARBALL]
set -euo pipefail
cd "$(dirname "$0")/.."
tarball="${1:-../shared/data/cifar10-jpeg.tar.gz}"
mkdir -p data
[[ -d data/cifar10-jpeg ]] || tar xzf "$tarball" -C data
build/cnnflow convert --from folder data/cifar10-jpeg/train --to data/cifar10-train.lmdb --shuffle --overwrite
build/cnnflow convert --from folder data/cifar10-jpeg/test --to data/cifar10-test.lmdb --overwrite
