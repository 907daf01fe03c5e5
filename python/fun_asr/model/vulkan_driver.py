"""Vulkan drivers known to corrupt memory under ggml's Vulkan backend, kept out of ``--device vulkan``.

Mesa's lavapipe (a Vulkan driver that runs on the CPU) before Mesa 25: Debian 12's 22.3.6 corrupts the process's
heap while its queue thread JIT-compiles a shader variant (LLVM 15's MCJIT emitting code) beside the thread that
records the next commands: a crash ("malloc(): unsorted double linked list corrupted", "free(): invalid pointer")
in about a third of the runs that decode the demo's first four held-out clips two at a time (docs/vulkan.md has
the evidence). ggml does not report a driver's version, so it is read here from the Vulkan loader
(``VkPhysicalDeviceDriverProperties.driverInfo``: "Mesa 22.3.6 (LLVM 15.0.6)") with ctypes; nothing is
read where no llvmpipe device is in use. ``FUN_ASR_ALLOW_BAD_VULKAN_DRIVER=1`` lets such a driver run anyway
(to reproduce the crash)."""

from __future__ import annotations

import ctypes
import functools
import os
import re

GOOD_LAVAPIPE = (25, 0)  # the first Mesa measured without the crash above (25.0.7); 23.x-24.x are untested
_MESA_VENDOR_ID = 0x10005  # VK_VENDOR_ID_MESA: lavapipe's vendorID
_PROPS_SIZE = 4096  # VkPhysicalDeviceProperties is 824 bytes on x86-64: room to spare


class _AppInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("pApplicationName", ctypes.c_char_p),
                ("applicationVersion", ctypes.c_uint32), ("pEngineName", ctypes.c_char_p),
                ("engineVersion", ctypes.c_uint32), ("apiVersion", ctypes.c_uint32)]


class _InstanceInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("flags", ctypes.c_uint32),
                ("pApplicationInfo", ctypes.POINTER(_AppInfo)), ("enabledLayerCount", ctypes.c_uint32),
                ("ppEnabledLayerNames", ctypes.c_void_p), ("enabledExtensionCount", ctypes.c_uint32),
                ("ppEnabledExtensionNames", ctypes.c_void_p)]


_PROPS2 = 1000059001  # VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2
_DRIVER_PROPS = 1000196000  # VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES


def _physical_devices(vk: ctypes.CDLL, instance: ctypes.c_void_p) -> list[tuple[int, str, str]]:
    """(vendorID, deviceName, driverInfo) of each physical device the loader lists (driverInfo: Mesa writes
    "Mesa 22.3.6 (LLVM 15.0.6)"; its driverVersion is no version)."""
    count = ctypes.c_uint32(0)
    vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), None)
    handles = (ctypes.c_void_p * count.value)()
    if count.value == 0 or vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), handles) != 0:
        return []
    found = []
    for handle in handles[: count.value]:
        driver = ctypes.create_string_buffer(_PROPS_SIZE)  # VkPhysicalDeviceDriverProperties
        driver[0:4] = _DRIVER_PROPS.to_bytes(4, "little")
        props = ctypes.create_string_buffer(_PROPS_SIZE)  # VkPhysicalDeviceProperties2: sType, pNext, properties
        props[0:4] = _PROPS2.to_bytes(4, "little")
        props[8:16] = ctypes.addressof(driver).to_bytes(8, "little")
        vk.vkGetPhysicalDeviceProperties2(ctypes.c_void_p(handle), props)
        vendor = int.from_bytes(props.raw[16 + 8 : 16 + 12], "little")
        name = props.raw[16 + 20 : 16 + 276].split(b"\0", 1)[0].decode("utf-8", "replace")
        info = driver.raw[276 : 276 + 256].split(b"\0", 1)[0].decode("utf-8", "replace")
        found.append((vendor, name, info))
    return found


def _mesa_version(driver_info: str) -> tuple[int, ...] | None:
    """(22, 3, 6) of "Mesa 22.3.6 (LLVM 15.0.6)"; None where it names no Mesa version."""
    m = re.match(r"Mesa (\d+)\.(\d+)(?:\.(\d+))?", driver_info)
    return tuple(int(x or 0) for x in m.groups()) if m else None


@functools.lru_cache(maxsize=1)
def lavapipe_versions() -> tuple[tuple[int, ...], ...]:
    """The Mesa version (major, minor, patch) of each lavapipe device the Vulkan loader lists; () where there is no
    loader, no instance or no lavapipe."""
    try:
        vk = ctypes.CDLL("libvulkan.so.1")
        vk.vkCreateInstance.restype = ctypes.c_int
        vk.vkEnumeratePhysicalDevices.restype = ctypes.c_int
        vk.vkGetPhysicalDeviceProperties2  # noqa: B018 (a loader before Vulkan 1.1 lacks it: AttributeError)
    except (OSError, AttributeError):
        return ()
    app = _AppInfo(0, None, b"fun-asr", 0, b"fun-asr", 0, (1 << 22) | (2 << 12))  # Vulkan 1.2
    create = _InstanceInfo(1, None, 0, ctypes.pointer(app), 0, None, 0, None)
    instance = ctypes.c_void_p()
    if vk.vkCreateInstance(ctypes.byref(create), None, ctypes.byref(instance)) != 0:
        return ()
    try:
        found = [_mesa_version(driver) for vendor, name, driver in _physical_devices(vk, instance)
                 if vendor == _MESA_VENDOR_ID and name.startswith("llvmpipe")]
        return tuple(v for v in found if v)
    finally:
        vk.vkDestroyInstance(instance, None)


def known_bad(description: str) -> str:
    """Why the Vulkan device described as ``description`` (ggml's description) is kept out, or '' where it is not:
    lavapipe ("llvmpipe (LLVM ...)") of a Mesa older than GOOD_LAVAPIPE."""
    if "llvmpipe" not in description.lower() or os.environ.get("FUN_ASR_ALLOW_BAD_VULKAN_DRIVER") == "1":
        return ""
    bad = sorted(v for v in lavapipe_versions() if v[:2] < GOOD_LAVAPIPE)
    if not bad:
        return ""
    mesa = ".".join(map(str, bad[0]))
    return (f"its driver is Mesa {mesa}'s lavapipe, which corrupts memory under ggml's Vulkan backend while it "
            f"compiles shaders (docs/vulkan.md); Mesa {GOOD_LAVAPIPE[0]} or later is taken, e.g. from Debian 12's "
            "bookworm-backports")
