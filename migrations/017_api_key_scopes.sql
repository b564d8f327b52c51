-- Two more API key scopes: call (list and call tools, answer their
-- servers' questions, sessions; implied by query) and users (name the end
-- user behind a request on the MCP endpoint).
ALTER TABLE api_keys DROP CONSTRAINT api_keys_scopes_check;
ALTER TABLE api_keys ADD CONSTRAINT api_keys_scopes_check
    CHECK (cardinality(scopes) > 0 AND scopes <@ ARRAY['admin', 'query', 'call', 'users']);

---- create above / drop below ----

ALTER TABLE api_keys DROP CONSTRAINT api_keys_scopes_check;
ALTER TABLE api_keys ADD CONSTRAINT api_keys_scopes_check
    CHECK (cardinality(scopes) > 0 AND scopes <@ ARRAY['admin', 'query']);
