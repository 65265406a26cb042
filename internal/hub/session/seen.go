package session

import "encoding/hex"

// seen remembers the last limit envelope ids received, oldest replaced
// first. Ids as protocol.NewID makes them (32 lowercase hex digits, what
// agents send) are kept as their 16 bytes, in a ring that grows to limit
// and no further; any other id is kept as its string, aside. A lookup
// scans the ring: at 512 entries that is a few hundred nanoseconds, and it
// spares a map whose buckets would cost more than the ids themselves.
type seen struct {
	limit int
	ring  [][16]byte
	next  int            // the slot replaced next once the ring is full
	other map[int]string // slots holding an id that is not 32 hex digits
}

// add records id and reports whether it is new.
func (s *seen) add(id string) bool {
	key, compact := compactID(id)
	for i := range s.ring {
		if o, ok := s.other[i]; ok {
			if !compact && o == id {
				return false
			}
			continue
		}
		if compact && s.ring[i] == key {
			return false
		}
	}
	slot := len(s.ring)
	if slot < s.limit {
		s.ring = append(s.ring, key)
	} else {
		slot = s.next
		s.ring[slot] = key
		s.next = (s.next + 1) % s.limit
	}
	delete(s.other, slot)
	if !compact {
		if s.other == nil {
			s.other = map[int]string{}
		}
		s.other[slot] = id
	}
	if len(s.other) == 0 {
		s.other = nil
	}
	return true
}

// compactID is id as 16 bytes when it is 32 lowercase hex digits; the
// encoding back is the same string, so two ids are equal exactly when
// their keys are.
func compactID(id string) (key [16]byte, ok bool) {
	if len(id) != 2*len(key) {
		return key, false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return key, false
		}
	}
	_, err := hex.Decode(key[:], []byte(id))
	return key, err == nil
}
