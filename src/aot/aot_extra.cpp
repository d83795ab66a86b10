// Reads attrs from MindSpore's AotExtra, the `extra` argument of an AOT kernel.
//
// Compiled alone with -D_GLIBCXX_USE_CXX11_ABI=0: MindSpore 2.x is built with the old
// std::string ABI and AotExtra's getters take and return std::string by value, so they must be
// called from code of that ABI. Only C types cross this file's boundary. The class below
// mirrors the layout of MindSpore's AotExtra (custom_aot_extra.h, which cannot be included:
// it pulls in MindSpore internals); the order of its virtual functions is its vtable.
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

// A named namespace, not an anonymous one: in an anonymous namespace the compiler knows no class
// derives from AotExtra and turns the calls into calls of its pure virtual functions.
namespace opforge_mirror {

class AotKernelData {
 public:
  virtual ~AotKernelData() = default;
};

class AotExtra {
 public:
  virtual ~AotExtra() = default;
  virtual bool HasAttr(std::string name) = 0;
  std::string Str(const std::string& name) { return GetAttrStr(name); }

 private:
  virtual bool GetAttrBool(std::string name) = 0;
  virtual int64_t GetAttrInt(std::string name) = 0;
  virtual float GetAttrFloat(std::string name) = 0;
  virtual std::string GetAttrStr(std::string name) = 0;
  virtual std::vector<int64_t> GetAttrIntVec(std::string name) = 0;
  virtual std::vector<float> GetAttrFloatVec(std::string name) = 0;
  virtual std::vector<std::vector<int64_t>> GetAttrInt2DVec(std::string name) = 0;
  virtual std::vector<std::vector<float>> GetAttrFloat2DVec(std::string name) = 0;
  std::vector<size_t> workspace_;
  AotKernelData* kernel_data_{nullptr};
};

}  // namespace opforge_mirror

namespace {

char* copy(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p) std::memcpy(p, s.c_str(), s.size() + 1);
  return p;
}

}  // namespace

extern "C" bool opforge_aot_extra_str(void* extra, const char* name, char** out, char** error) {
  *out = nullptr;
  *error = nullptr;
  if (!extra) return false;
  try {
    auto* ex = static_cast<opforge_mirror::AotExtra*>(extra);
    if (!ex->HasAttr(name)) return false;
    *out = copy(ex->Str(name));
    return true;
  } catch (const std::exception& e) {
    *error = copy(e.what());
  } catch (...) {
    *error = copy("unknown exception");
  }
  return false;
}
