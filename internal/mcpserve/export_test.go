package mcpserve

// PrefixedName is prefixedName, for the tests.
var PrefixedName = prefixedName
