#!/usr/bin/env bash
# Install the Debian packages the real-SSH and Prometheus tests need, only when they are missing.
#
#   bash scripts/install-test-deps.sh           install what is missing (quiet; < 1 s when nothing is)
#   bash scripts/install-test-deps.sh --check   only say what is missing (exit 1 if anything is)
#
# Packages: openssh-server (sshd started by the tests), openssh-client (ssh, ssh-keygen),
# iproute2 (ip netns / veth for several test hosts), tmux, prometheus (the tests start their own
# prometheus on loopback; its promtool checks expositions and the rules file).
#
# Privileges: runs apt-get directly as root, through `sudo -n` when not root and sudo works
# without a password, and otherwise prints the command to run and exits 1.
#
# No system service is started: for the duration of the install a policy-rc.d that answers 101
# ("action forbidden") is put in place, so invoke-rc.d / deb-systemd-invoke refuse to start
# ssh.service or prometheus.service; an existing policy-rc.d is moved aside and put back
# afterwards. The tests start their own sshd and prometheus on their own ports with their own
# configs; the system services stay stopped.
set -euo pipefail

PACKAGES=(openssh-server openssh-client iproute2 tmux prometheus)
# What the tests actually run; on a machine without dpkg these decide.
BINARIES=(/usr/sbin/sshd ssh ssh-keygen ip tmux prometheus promtool)

check_only=0
case "${1:-}" in
"") ;;
--check) check_only=1 ;;
*)
    echo "usage: $0 [--check]" >&2
    exit 2
    ;;
esac

missing_binaries() {
    local b
    for b in "${BINARIES[@]}"; do
        command -v "$b" >/dev/null 2>&1 || echo "$b"
    done
}

if ! command -v dpkg-query >/dev/null 2>&1; then
    # Not Debian: nothing we can install, but the binaries may be there anyway.
    gone=$(missing_binaries)
    if [ -z "$gone" ]; then exit 0; fi
    echo "install-test-deps: not a Debian system and missing: $(echo "$gone" | tr '\n' ' ')" >&2
    echo "install-test-deps: install OpenSSH (server and client), iproute2, tmux and Prometheus" \
        "(prometheus, promtool) by hand; the real-SSH and Prometheus tests skip without them" >&2
    exit 1
fi

# One dpkg-query for all packages: prints "name installed" per package it knows.
missing=()
status=$(dpkg-query -W -f='${Package} ${db:Status-Status}\n' "${PACKAGES[@]}" 2>/dev/null || true)
for p in "${PACKAGES[@]}"; do
    if ! grep -qx "$p installed" <<<"$status"; then missing+=("$p"); fi
done
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi

install_cmd="apt-get install -y --no-install-recommends ${missing[*]}"
if [ $check_only -eq 1 ]; then
    echo "install-test-deps: missing ${missing[*]}; run: bash $0 (or: sudo $install_cmd)" >&2
    exit 1
fi

if [ "$(id -u)" -eq 0 ]; then
    SUDO=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then
    SUDO=(sudo -n)
else
    echo "install-test-deps: missing ${missing[*]} and not root (no password-less sudo)." >&2
    echo "install-test-deps: run:  sudo apt-get update && sudo $install_cmd" >&2
    echo "install-test-deps: until then the real-SSH and Prometheus tests skip." >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-test-deps: missing ${missing[*]} and apt-get is not available" >&2
    exit 1
fi

log=$(mktemp "${TMPDIR:-/tmp}/install-test-deps.XXXXXX")
policy=/usr/sbin/policy-rc.d
backup="$policy.gpuops-test-deps"
restore_policy() {
    "${SUDO[@]}" rm -f "$policy"
    if "${SUDO[@]}" test -e "$backup"; then "${SUDO[@]}" mv -f "$backup" "$policy"; fi
    rm -f "$log"
}
if "${SUDO[@]}" test -e "$policy"; then "${SUDO[@]}" mv -f "$policy" "$backup"; fi
trap restore_policy EXIT
trap 'exit 130' INT TERM
printf '#!/bin/sh\n# gpuops install-test-deps: start no service while installing\nexit 101\n' |
    "${SUDO[@]}" tee "$policy" >/dev/null
"${SUDO[@]}" chmod 755 "$policy"

apt_env=(env DEBIAN_FRONTEND=noninteractive)
apt_install=("${SUDO[@]}" "${apt_env[@]}" apt-get install -y -qq --no-install-recommends
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${missing[@]}")

echo "install-test-deps: installing ${missing[*]}" >&2
if ! "${apt_install[@]}" >"$log" 2>&1; then
    # Usually stale or absent package lists (fresh containers ship none): update once, retry.
    if ! "${SUDO[@]}" "${apt_env[@]}" apt-get update -qq >>"$log" 2>&1 ||
        ! "${apt_install[@]}" >>"$log" 2>&1; then
        tail -n 20 "$log" >&2
        echo "install-test-deps: failed to install ${missing[*]}" >&2
        exit 1
    fi
fi
exit 0
