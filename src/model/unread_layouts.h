// Cache layouts kvpage does not read yet.
//
// A config of an architecture whose cache is not just the layers ModelSpec describes (a
// recurrent state kvpage cannot size, a second per-token tensor, layers of kinds it does not
// know) must not be planned as if every layer were full attention: that plan would look right
// and be wrong. RefuseUnreadLayouts finds the field that announces such a layout and returns
// InvalidArgument naming it and the architecture, before any other field is read.
#ifndef KVPAGE_MODEL_UNREAD_LAYOUTS_H_
#define KVPAGE_MODEL_UNREAD_LAYOUTS_H_

#include "absl/status/status.h"
#include "model/config_reader.h"

namespace kvpage::internal {

absl::Status RefuseUnreadLayouts(const ConfigReader& cfg);

}  // namespace kvpage::internal

#endif  // KVPAGE_MODEL_UNREAD_LAYOUTS_H_
