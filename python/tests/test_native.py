"""kvtier._native, the Rust client core as an extension module, is built the
way it must ship: for the stable ABI, not linked against one interpreter's
libpython (a module that is runs only where that libpython is installed;
one built so failed to load on a machine with another Python)."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from kvtier import _native, dataplane


def test_the_native_core_is_importable_here():
    assert dataplane.available(), dataplane.why_unavailable()
    assert _native.MAX_STRIPES == dataplane.MAX_STRIPES
    assert _native.STRIPE_MIN_BLOCKS == dataplane.STRIPE_MIN_BLOCKS


def test_it_does_not_link_libpython():
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.fail("readelf is not installed (binutils)")
    assert _native.__file__ is not None and _native.__file__.endswith(".abi3.so"), _native.__file__
    needed = subprocess.run([readelf, "-d", _native.__file__], capture_output=True, text=True, check=True).stdout
    assert "libpython" not in needed, needed
