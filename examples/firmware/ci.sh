#!/usr/bin/env bash
# The firmware example in CI: installs what it needs, checks format,
# lints and docs, builds both images (release: opt-level "s", LTO, panic abort, one codegen unit),
# runs each under QEMU's mps2-an386 (Cortex-M4F) with semihosting, requires "PASS" and
# exit status 0, and reports code size and RAM. Fails if the BSP image's `.text` exceeds
# 32 KiB. Run from anywhere: `bash examples/firmware/ci.sh`.
set -euo pipefail
cd "$(dirname "$0")"

target=thumbv7em-none-eabihf
limit=32768
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

if ! rustup target list --installed | grep -qx "$target"; then
  rustup target add "$target"
fi
if ! command -v qemu-system-arm >/dev/null || ! command -v arm-none-eabi-size >/dev/null; then
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-system-arm binutils-arm-none-eabi >/dev/null
fi

cargo fmt -- --check
cargo clippy --release --locked -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --locked
cargo build --release --locked

for image in train bsp; do
  elf="target/$target/release/$image"
  log="$(mktemp)"
  status=0
  timeout 300 qemu-system-arm -M mps2-an386 -nographic -semihosting-config enable=on,target=native \
    -kernel "$elf" </dev/null >"$log" 2>&1 || status=$?
  cat "$log"
  if [ "$status" -ne 0 ] || ! grep -qx PASS "$log"; then
    echo "firmware image $image failed under QEMU (exit status $status; PASS expected)"
    exit 1
  fi
  rm -f "$log"
  arm-none-eabi-size -A "$elf" | awk -v image="$image" '
    $1 == ".vector_table" || $1 == ".text" || $1 == ".rodata" || $1 == ".data" || $1 == ".bss" || $1 == ".uninit" { s[$1] = $2 }
    END {
      printf "%s: .text %d bytes, flash (.vector_table + .text + .rodata + .data) %d bytes, static RAM (.data + .bss + .uninit) %d bytes\n",
        image, s[".text"], s[".vector_table"] + s[".text"] + s[".rodata"] + s[".data"], s[".data"] + s[".bss"] + s[".uninit"]
    }'
done

text="$(arm-none-eabi-size -A "target/$target/release/bsp" | awk '$1 == ".text" { print $2 }')"
if [ "$text" -gt "$limit" ]; then
  echo "the BSP image's .text is $text bytes, over the 32 KiB ($limit bytes) budget"
  exit 1
fi
echo "firmware: both images passed under QEMU; the BSP image's .text ($text bytes) fits in 32 KiB"
