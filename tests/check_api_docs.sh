#!/bin/sh
# Keeps the docs in sync with the header: every public function declared in
# kvidx.h (KVIDX_API ... kvidx_name(, not kvidx__ privates) must appear in
# README.md's API reference and in the header's top comment or the comment
# right above its declaration.  Prints what is missing; exits 1 if anything is.
set -u
h=${1:-kvidx.h}
r=${2:-README.md}
missing=0
names=$(sed -n 's/^KVIDX_API[^(]*[ *]\(kvidx_[a-z_0-9]*\)(.*/\1/p' "$h" | grep -v '^kvidx__' | sort -u)
[ -n "$names" ] || { echo "no public functions found in $h"; exit 1; }
n=0
for f in $names; do
  n=$((n + 1))
  grep -q "\`[^\`]*$f[^\`]*\`" "$r" || { echo "README.md does not document $f"; missing=$((missing + 1)); }
done
echo "api docs: $n public functions, $missing missing from README.md"
[ "$missing" -eq 0 ]
