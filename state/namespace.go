package state

// Namespaces scope keyed state below the key: a window operator keeps the
// contents of each window of a key in the namespace of that window. A
// namespaced handle starts in the zero namespace; SetNamespace moves it.
// Clear after SetNamespace drops the entry of the current key in that
// namespace, which is how a window is purged.
//
// MergeNamespaces (List, Reducing, Aggregating) is for merging windows
// (session windows): it folds the sources' entries of the current key into
// the target's, in the order given, and removes the sources. Sources that
// are absent or expired, or equal to the target, are skipped. The handle
// stays in its current namespace.

// NamespacedValue is Value state scoped to a key and a namespace.
type NamespacedValue[N comparable, V any] interface {
	Value[V]
	// SetNamespace scopes the handle to namespace n.
	SetNamespace(n N)
}

// NamespacedList is List state scoped to a key and a namespace.
type NamespacedList[N comparable, V any] interface {
	List[V]
	// SetNamespace scopes the handle to namespace n.
	SetNamespace(n N)
	// MergeNamespaces appends the sources' lists of the current key, in
	// the order given, to the target's list and removes the sources.
	MergeNamespaces(target N, sources ...N)
}

// NamespacedMap is Map state scoped to a key and a namespace.
type NamespacedMap[N comparable, UK comparable, UV any] interface {
	Map[UK, UV]
	// SetNamespace scopes the handle to namespace n.
	SetNamespace(n N)
}

// NamespacedReducing is Reducing state scoped to a key and a namespace.
type NamespacedReducing[N comparable, V any] interface {
	Reducing[V]
	// SetNamespace scopes the handle to namespace n.
	SetNamespace(n N)
	// MergeNamespaces reduces the sources' values of the current key into
	// the target's, Reduce(target, source) in the order given, and removes
	// the sources.
	MergeNamespaces(target N, sources ...N)
}

// NamespacedAggregating is Aggregating state scoped to a key and a
// namespace.
type NamespacedAggregating[N comparable, IN, OUT any] interface {
	Aggregating[IN, OUT]
	// SetNamespace scopes the handle to namespace n.
	SetNamespace(n N)
	// MergeNamespaces merges the sources' accumulators of the current key
	// into the target's, Merge(target, source) in the order given, and
	// removes the sources. It panics if the descriptor has no Merge.
	MergeNamespaces(target N, sources ...N)
}
