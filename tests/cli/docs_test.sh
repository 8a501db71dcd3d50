#!/usr/bin/env bash
# The docs cannot rot: every `cnnflow COMMAND` written in README.md,
# CONTRIBUTING.md and docs/*.md is a command the binary has, and every
# option written after it on the same command line is one that
# `cnnflow COMMAND --help` shows; every relative link leads to a file, and
# a link's #anchor to a heading of it.
#
# What counts as written: the lines of fenced code blocks marked sh, bash,
# shell or console (or not marked; blocks marked yaml, python, text, ... are
# not commands), and inline code spans (which may wrap across lines). In
# those, `build/cnnflow X` and `cnnflow X` are the same; shell comments
# (`# ...`) are not checked. A command's options end at `--` (what follows
# is another program's command line: a `cnnflow ...` in it is checked on
# its own), at `;`, `&&`, `||` and `|`, and at the next `cnnflow`. A quoted
# value (`--set 'graph.devices=[cpu:0]'`) is not an option; `--set` itself
# must be in the help.
#   usage: docs_test.sh CNNFLOW_BINARY [FILE.md ...]   (default: the docs above)
set -u
cnnflow="$1"
shift
out=$(mktemp -d)
trap '[[ -n "${DOCS_TEST_KEEP:-}" ]] && cp "$out/rows" "$DOCS_TEST_KEEP"; rm -rf "$out"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
[[ -x "$cnnflow" ]] || fail "no cnnflow binary at '$cnnflow'"
default_docs=0
if (( $# )); then docs=("$@"); else default_docs=1; docs=(README.md CONTRIBUTING.md docs/*.md); fi
for f in "${docs[@]}"; do [[ -f "$f" ]] || fail "no file $f (run from the repository root)"; done

# Pass 1 (awk, POSIX: mawk will do). Prints one row per thing to check:
#   CMD <TAB> FILE:LINE <TAB> COMMAND <TAB> OPTIONS (space-separated)
#   LINK <TAB> FILE:LINE <TAB> TARGET
cat > "$out/extract.awk" <<'AWK'
function trim(s) { sub(/^[ \t]+/, "", s); sub(/[ \t]+$/, "", s); return s }
# A shell line without its comment: from a # at the start or after a blank,
# outside quotes.
function strip_comment(s,   i, c, q, prev) {
  q = ""; prev = " "
  for (i = 1; i <= length(s); i++) {
    c = substr(s, i, 1)
    if (q != "") { if (c == q) q = "" }
    else if (c == "'" || c == "\"") q = c
    else if (c == "#" && (prev == " " || prev == "\t")) return substr(s, 1, i - 1)
    prev = c
  }
  return s
}
# Every `cnnflow COMMAND [options]` in a piece of code.
function commands(where, text,   rest, tail, n, t, j, sub_, tok, name, opts, skip) {
  rest = text
  while (match(rest, /(^|[^A-Za-z0-9_.-])cnnflow[ \t]+/)) {
    tail = substr(rest, RSTART + RLENGTH)
    rest = tail
    gsub(/'[^']*'/, "Q", tail)
    gsub(/"[^"]*"/, "Q", tail)
    n = split(tail, t, /[ \t]+/)
    if (n < 1) continue
    sub_ = t[1]
    gsub(/^[[(]+/, "", sub_)
    gsub(/[]),.;:]+$/, "", sub_)
    opts = ""
    j = 2
    if (sub_ ~ /^-/) { sub_ = "-"; j = 1 }
    else if (sub_ !~ /^[a-z][a-z0-9_-]*$/) continue
    else if (t[1] ~ /;$/) j = n + 1
    skip = 0
    for (; j <= n; j++) {
      tok = t[j]
      if (tok == "--" || tok == "&&" || tok == "||" || tok == "|" || tok == ";") break
      if (tok ~ /(^|\/)cnnflow$/) break
      if (skip) { skip = 0; continue }
      name = tok
      gsub(/^[[(]+/, "", name)
      if (name ~ /^--?[A-Za-z]/) {
        sub(/=.*/, "", name)
        gsub(/[^A-Za-z0-9-].*$/, "", name)
        opts = opts (opts == "" ? "" : " ") name
        if (name == "--set") skip = 1
      }
      if (tok ~ /;$/) break
    }
    print "CMD\t" where "\t" sub_ "\t" opts
  }
}
# Inline code spans of a paragraph (which may wrap), and its links outside them.
function paragraph(   i, n, c, run, k, close_, found, body, line, prose, m, target, pre) {
  if (para == "") return
  prose = ""
  n = length(para)
  i = 1
  while (i <= n) {
    c = substr(para, i, 1)
    if (c != "`") { prose = prose c; i++; continue }
    run = 0
    while (i + run <= n && substr(para, i + run, 1) == "`") run++
    # the closing run: exactly as many backticks
    found = 0
    for (k = i + run; k <= n; k++) {
      if (substr(para, k, 1) != "`") continue
      close_ = 0
      while (k + close_ <= n && substr(para, k + close_, 1) == "`") close_++
      if (close_ == run) { found = 1; break }
      k += close_
    }
    if (!found) { prose = prose substr(para, i, run); i += run; continue }
    body = substr(para, i + run, k - i - run)
    pre = substr(para, 1, i - 1)
    line = start + gsub(/\n/, "\n", pre)
    gsub(/\n/, " ", body)
    commands(pfile ":" line, body)
    # keep the prose's line count: a span becomes its newlines
    m = substr(para, i, k + run - i)
    prose = prose newlines(m)
    i = k + run
  }
  # links outside code: ](target)
  line = start
  n = split(prose, plines, "\n")
  for (k = 1; k <= n; k++) {
    m = plines[k]
    while (match(m, /\]\([^) \t]+\)/)) {
      target = substr(m, RSTART + 2, RLENGTH - 3)
      m = substr(m, RSTART + RLENGTH)
      if (target ~ /^[a-z]+:/) continue
      print "LINK\t" pfile ":" (start + k - 1) "\t" target
    }
  }
  para = ""
}
function newlines(s,   r, i) { r = ""; for (i = 1; i <= length(s); i++) if (substr(s, i, 1) == "\n") r = r "\n"; return r }
FNR == 1 { paragraph(); fence = ""; cont = "" }
{
  if (fence != "") {
    if ($0 ~ /^[ \t]*(```|~~~)[ \t]*$/ && index(trim($0), fence) == 1) { fence = ""; cont = ""; next }
    if (!shell) next
    if (cont == "") contline = FNR
    s = $0
    if (s ~ /\\$/) { cont = cont substr(s, 1, length(s) - 1) " "; next }
    commands(FILENAME ":" contline, strip_comment(cont s))
    cont = ""
    next
  }
  if (match($0, /^[ \t]*(```|~~~)/)) {
    paragraph()
    fence = substr(trim($0), 1, 3)
    lang = tolower(trim(substr(trim($0), 4)))
    sub(/[ \t{].*/, "", lang)
    shell = (lang == "" || lang == "sh" || lang == "bash" || lang == "shell" || lang == "console")
    next
  }
  if ($0 ~ /^[ \t]*$/) { paragraph(); next }
  if (para == "") { start = FNR; pfile = FILENAME }
  para = para $0 "\n"
}
END { paragraph() }
AWK
awk -f "$out/extract.awk" "${docs[@]}" > "$out/rows" || fail "could not read the docs"

# A Markdown file's heading anchors, as GitHub makes them: lower case, only
# letters, digits, blanks, _ and -, blanks to -; a repeated one gets -1, -2.
anchors() {
  awk '
    /^[ \t]*(```|~~~)/ { code = !code; next }
    code || !/^#+[ \t]/ { next }
    { h = $0; sub(/^#+[ \t]+/, "", h); sub(/[ \t#]+$/, "", h); h = tolower(h)
      gsub(/[^a-z0-9 _-]/, "", h); gsub(/ /, "-", h)
      if (h in seen) { seen[h]++; print h "-" seen[h] } else { seen[h] = 0; print h } }' "$1"
}

errors=()
ncmd=0
nopt=0
nlink=0
declare -A help_rc=()
# The help text of a command, asked once: $out/help.COMMAND; its status in help_rc.
ask_help() {
  local c=$1
  [[ -n "${help_rc[$c]+x}" ]] && return
  if [[ $c == - ]]; then
    "$cnnflow" --help > "$out/help.-" 2>&1
  else
    "$cnnflow" "$c" --help > "$out/help.$c" 2>&1
  fi
  help_rc[$c]=$?
}
while IFS=$'\t' read -r kind where a b; do
  if [[ $kind == CMD ]]; then
    c=$a
    ncmd=$((ncmd + 1))
    ask_help "$c"
    if [[ ${help_rc[$c]} != 0 ]]; then
      errors+=("$where: unknown command 'cnnflow $c' ('cnnflow $c --help' exited ${help_rc[$c]})")
      continue
    fi
    shown="cnnflow $c"; [[ $c == - ]] && shown=cnnflow
    for o in $b; do
      nopt=$((nopt + 1))
      [[ $o == --help || $o == -h ]] && continue
      grep -qE -- "(^|[^A-Za-z0-9-])$o([^A-Za-z0-9-]|\$)" "$out/help.$c" ||
        errors+=("$where: '$shown' has no option '$o' (not in '$shown --help')")
    done
  elif [[ $kind == LINK ]]; then
    nlink=$((nlink + 1))
    file=${where%:*}
    path=${a%%#*}
    anchor=""
    [[ $a == *#* ]] && anchor=${a#*#}
    if [[ -z $path ]]; then
      target=$file
    else
      target="$(dirname "$file")/$path"
      if [[ ! -e $target ]]; then
        errors+=("$where: link to '$a': no file $target")
        continue
      fi
    fi
    if [[ -n $anchor && -f $target && $target == *.md ]]; then
      anchors "$target" | grep -qxF -- "$anchor" ||
        errors+=("$where: link to '$a': no heading with the anchor #$anchor in $target")
    fi
  fi
done < "$out/rows"

if (( ${#errors[@]} )); then
  printf '%s\n' "${errors[@]}"
  fail "${#errors[@]} command(s), option(s) or link(s) in the docs do not exist"
fi
distinct=$(awk -F'\t' '$1 == "CMD" { print $3 }' "$out/rows" | sort -u | wc -l)
if (( default_docs )); then
  # A parser that silently finds nothing must not pass.
  (( ncmd >= 50 && distinct >= 12 && nlink >= 30 )) ||
    fail "found only $ncmd command lines ($distinct commands) and $nlink links in the docs"
fi
echo "PASS: docs name $ncmd cnnflow command lines ($distinct commands) with $nopt options, and $nlink links; all exist"
