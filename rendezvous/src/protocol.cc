#include "protocol.h"

namespace dist::rendezvous::wire {

std::optional<Op> decode_op(Dialect dialect, std::uint8_t byte) {
  if (dialect == Dialect::kLegacy) {
    switch (byte) {
      case legacy::kSet:
        return Op::kSet;
      case legacy::kCompareSet:
        return Op::kCompareSet;
      case legacy::kGet:
        return Op::kGet;
      case legacy::kAdd:
        return Op::kAdd;
      case legacy::kCheck:
        return Op::kCheck;
      case legacy::kWait:
        return Op::kWait;
      case legacy::kGetNumKeys:
        return Op::kGetNumKeys;
      case legacy::kWatchKey:
        return Op::kWatchKey;
      case legacy::kDeleteKey:
        return Op::kDeleteKey;
      default:
        return std::nullopt;
    }
  }
  switch (byte) {
    case current::kValidate:
      return Op::kValidate;
    case current::kSet:
      return Op::kSet;
    case current::kCompareSet:
      return Op::kCompareSet;
    case current::kGet:
      return Op::kGet;
    case current::kAdd:
      return Op::kAdd;
    case current::kCheck:
      return Op::kCheck;
    case current::kWait:
      return Op::kWait;
    case current::kGetNumKeys:
      return Op::kGetNumKeys;
    case current::kDeleteKey:
      return Op::kDeleteKey;
    case current::kAppend:
      return Op::kAppend;
    case current::kMultiGet:
      return Op::kMultiGet;
    case current::kMultiSet:
      return Op::kMultiSet;
    case current::kCancelWait:
      return Op::kCancelWait;
    case current::kPing:
      return Op::kPing;
    case current::kQueuePush:
      return Op::kQueuePush;
    case current::kQueuePop:
      return Op::kQueuePop;
    case current::kQueueLen:
      return Op::kQueueLen;
    case current::kListKeys:
      return Op::kListKeys;
    case current::kBarrier:
      return Op::kBarrier;
    case ext::kHello:
      return Op::kHello;
    case ext::kAuth:
      return Op::kAuth;
    case ext::kSetExt:
      return Op::kSetExt;
    case ext::kWaitDeleted:
      return Op::kWaitDeleted;
    case ext::kDeleteAllExcept:
      return Op::kDeleteAllExcept;
    default:
      return std::nullopt;
  }
}

std::uint8_t encode_op(Op op) {
  switch (op) {
    case Op::kValidate:
      return current::kValidate;
    case Op::kSet:
      return current::kSet;
    case Op::kCompareSet:
      return current::kCompareSet;
    case Op::kGet:
      return current::kGet;
    case Op::kAdd:
      return current::kAdd;
    case Op::kCheck:
      return current::kCheck;
    case Op::kWait:
      return current::kWait;
    case Op::kGetNumKeys:
      return current::kGetNumKeys;
    case Op::kWatchKey:
      return legacy::kWatchKey;
    case Op::kDeleteKey:
      return current::kDeleteKey;
    case Op::kAppend:
      return current::kAppend;
    case Op::kMultiGet:
      return current::kMultiGet;
    case Op::kMultiSet:
      return current::kMultiSet;
    case Op::kCancelWait:
      return current::kCancelWait;
    case Op::kPing:
      return current::kPing;
    case Op::kQueuePush:
      return current::kQueuePush;
    case Op::kQueuePop:
      return current::kQueuePop;
    case Op::kQueueLen:
      return current::kQueueLen;
    case Op::kListKeys:
      return current::kListKeys;
    case Op::kBarrier:
      return current::kBarrier;
    case Op::kHello:
      return ext::kHello;
    case Op::kAuth:
      return ext::kAuth;
    case Op::kSetExt:
      return ext::kSetExt;
    case Op::kWaitDeleted:
      return ext::kWaitDeleted;
    case Op::kDeleteAllExcept:
      return ext::kDeleteAllExcept;
  }
  return 0xFF;
}

}  // namespace dist::rendezvous::wire
