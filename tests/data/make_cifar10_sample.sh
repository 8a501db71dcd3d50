#!/usr/bin/env bash
# Makes tests/data/cifar10-jpeg-sample/: the first two test images of each
# class of the CIFAR-10 JPEG set (DATA.md: cifar10-jpeg.tar.gz), as they are
# in the tarball, for the `cifar` source's test (which writes them as a
# binary batch and compares with the `folder` source's decode).
#   tests/data/make_cifar10_sample.sh ../shared/data/cifar10-jpeg.tar.gz
set -euo pipefail
cd "$(dirname "$0")"
tarball=${1:?usage: make_cifar10_sample.sh CIFAR10_JPEG_TARBALL}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar xzf "$tarball" -C "$tmp" --wildcards 'cifar10-jpeg/test/*/000[01].jpg'
rm -rf cifar10-jpeg-sample
mv "$tmp/cifar10-jpeg/test" cifar10-jpeg-sample
find cifar10-jpeg-sample -type f | sort
