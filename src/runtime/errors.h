// Runtime errors: C++ exceptions whose message starts with "[op]", mapped to Python exceptions.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace opforge {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct TypeError : Error { using Error::Error; };     // -> Python TypeError
struct ValueError : Error { using Error::Error; };    // -> Python ValueError
struct IndexError : Error { using Error::Error; };    // -> Python IndexError
struct RuntimeError : Error { using Error::Error; };  // -> Python RuntimeError
struct MemoryError : Error { using Error::Error; };   // -> Python MemoryError (an allocation failed)

// Builds "[op] part1part2..." from streamable parts.
template <typename... Parts>
std::string message(const std::string& op, Parts&&... parts) {
  std::ostringstream os;
  os << '[' << op << "] ";
  (os << ... << std::forward<Parts>(parts));
  return os.str();
}

template <typename E, typename... Parts>
[[noreturn]] void fail(const std::string& op, Parts&&... parts) {
  throw E(message(op, std::forward<Parts>(parts)...));
}

// The op whose Forward runs on this thread (Function<T>::Apply sets it), so that checks deep in
// the runtime (the broadcasting loop, broadcast_to) can name the op the user called.
const char* current_op();
class CurrentOpScope {
 public:
  explicit CurrentOpScope(const char* op);
  ~CurrentOpScope();
  CurrentOpScope(const CurrentOpScope&) = delete;
  CurrentOpScope& operator=(const CurrentOpScope&) = delete;

 private:
  const char* previous_;
};

}  // namespace opforge
