# Sourced by scripts/prepare_*.sh: a data set's file from its canonical URL,
# checked against a pinned SHA-256 before anything reads it.
#   verify_sha256 FILE EXPECTED      fails (exit 1) naming both hashes
#   fetch_verified URL EXPECTED DEST downloads to DEST.part, verifies, renames;
#                                    a DEST already there is verified, not fetched
# A test points URL at a local file:// archive and EXPECTED at its hash
# through each script's CNNFLOW_*_URL / CNNFLOW_*_SHA256 variables; nothing
# else sets them.

verify_sha256() {
  local file=$1 expected=$2 got
  got=$(sha256sum "$file" | cut -d' ' -f1)
  if [[ "$got" != "$expected" ]]; then
    echo "error: $file: SHA-256 mismatch: got $got, expected $expected" \
         "(a corrupt or different file; delete it and try again)" >&2
    return 1
  fi
  echo "$file: SHA-256 ok ($expected)"
}

fetch_verified() {
  local url=$1 expected=$2 dest=$3
  if [[ -f "$dest" ]]; then
    verify_sha256 "$dest" "$expected"
    return
  fi
  mkdir -p "$(dirname "$dest")"
  echo "downloading $url"
  if command -v curl >/dev/null; then
    curl -fL --retry 3 -o "$dest.part" "$url" || { rm -f "$dest.part"; echo "error: cannot download $url" >&2; return 1; }
  else
    wget -q -O "$dest.part" "$url" || { rm -f "$dest.part"; echo "error: cannot download $url" >&2; return 1; }
  fi
  verify_sha256 "$dest.part" "$expected" || { rm -f "$dest.part"; return 1; }
  mv "$dest.part" "$dest"
}

# The first path in a tar.gz (its top folder), to tell archives apart.
tar_top() { tar tzf "$1" | head -1 | cut -d/ -f1; }
