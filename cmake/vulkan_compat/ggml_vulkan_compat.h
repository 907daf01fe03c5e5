// Forced into ggml-vulkan.cpp (-include) when the Vulkan headers predate VK_EXT_layer_settings (Debian 12's are
// 1.3.239): ggml 0.15.3 uses its C++ types unconditionally. The same configuration of vulkan.hpp as
// ggml-vulkan.cpp's own (the dynamic dispatcher it names), then the types, with the extension's layout and
// structure type (Vulkan 1.3.272), so that the instance's create-info chain is what newer headers make. fun-asr's
// own code; the extension's definition is Khronos' public specification.
#pragma once

#include <vulkan/vulkan_core.h>

#ifndef VK_EXT_layer_settings

#define VULKAN_HPP_DISPATCH_LOADER_DYNAMIC 1
namespace vk { class DispatchLoaderDynamic; }
vk::DispatchLoaderDynamic & ggml_vk_default_dispatcher();
#define VULKAN_HPP_DEFAULT_DISPATCHER ggml_vk_default_dispatcher()
#include <vulkan/vulkan.hpp>

#include <cstdint>
#include <vector>

namespace vk {

enum class LayerSettingTypeEXT : int32_t {
    eBool32 = 0,
    eInt32 = 1,
    eInt64 = 2,
    eUint32 = 3,
    eUint64 = 4,
    eFloat32 = 5,
    eFloat64 = 6,
    eString = 7,
};

struct LayerSettingEXT {  // VkLayerSettingEXT
    const char * pLayerName = nullptr;
    const char * pSettingName = nullptr;
    LayerSettingTypeEXT type = LayerSettingTypeEXT::eBool32;
    uint32_t valueCount = 0;
    const void * pValues = nullptr;
};

struct LayerSettingsCreateInfoEXT {  // VkLayerSettingsCreateInfoEXT
    VkStructureType sType = static_cast<VkStructureType>(1000496000);  // VK_STRUCTURE_TYPE_LAYER_SETTINGS_CREATE_INFO_EXT
    const void * pNext = nullptr;
    uint32_t settingCount = 0;
    const LayerSettingEXT * pSettings = nullptr;
    explicit LayerSettingsCreateInfoEXT(const std::vector<LayerSettingEXT> & settings)
        : settingCount(static_cast<uint32_t>(settings.size())), pSettings(settings.data()) {}
};

}  // namespace vk

#endif  // VK_EXT_layer_settings
