#!/usr/bin/env bash
# The standalone smoke test on a 32-bit ARM kernel: the shipped static
# armv7 binary, in the Debian armhf VM of `scripts/arm-vm.sh --arch armhf`
# (a Cortex-A15, Debian's armmp-lpae kernel), with that system's runc and
# crun, pulling the arm/v7 image of a three-platform index
# (scripts/arm-smoke.sh). Not part of scripts/test.sh, which has no time
# left for a second emulated system; run it by hand.
# Usage: scripts/test-armv7.sh [RUNTIME...]   (default: runc crun)
exec "$(dirname "${BASH_SOURCE[0]}")/test-arm.sh" --armhf "$@"
