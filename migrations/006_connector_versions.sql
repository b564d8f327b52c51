-- Every replica keeps a live copy of each connector (its connection, catalog
-- flags and agent settings) and must learn of every change to it, whoever
-- made it: a replica's RPC, the owner's catalog sync, or an operator's SQL.
--
-- config_version counts the changes of what a live copy is built from: the
-- connector's settings, secrets and active flag, and its tools' catalog and
-- flags. Triggers bump it, so a direct SQL edit counts too; health and
-- counter writes leave it alone. Every bump, insert and delete notifies
-- channel connector_changes with the id and version only (never a secret);
-- a replica re-reads the row. A lost notification is caught by the
-- periodic comparison of versions.
--
-- version_xact lets a transaction that changes many tools bump its
-- connector once.

ALTER TABLE connectors ADD COLUMN config_version bigint NOT NULL DEFAULT 1,
                       ADD COLUMN version_xact   xid8;

CREATE FUNCTION connectors_bump_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.config_version = OLD.config_version AND
       (NEW.name, NEW.description, NEW.transport, NEW.config, NEW.sealed_secrets, NEW.active) IS DISTINCT FROM
       (OLD.name, OLD.description, OLD.transport, OLD.config, OLD.sealed_secrets, OLD.active) THEN
        NEW.config_version := OLD.config_version + 1;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER connectors_bump_version BEFORE UPDATE ON connectors
    FOR EACH ROW EXECUTE FUNCTION connectors_bump_version();

CREATE FUNCTION connectors_notify_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('connector_changes', json_build_object('id', OLD.id, 'deleted', true)::text);
    ELSE
        PERFORM pg_notify('connector_changes', json_build_object('id', NEW.id, 'version', NEW.config_version)::text);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER connectors_notify_insert_delete AFTER INSERT OR DELETE ON connectors
    FOR EACH ROW EXECUTE FUNCTION connectors_notify_change();
CREATE TRIGGER connectors_notify_update AFTER UPDATE ON connectors
    FOR EACH ROW WHEN (OLD.config_version IS DISTINCT FROM NEW.config_version)
    EXECUTE FUNCTION connectors_notify_change();

CREATE FUNCTION tools_bump_connector() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE connectors SET config_version = config_version + 1, version_xact = pg_current_xact_id()
     WHERE id = CASE WHEN TG_OP = 'DELETE' THEN OLD.connector_id ELSE NEW.connector_id END
       AND version_xact IS DISTINCT FROM pg_current_xact_id();
    RETURN NULL;
END
$$;

CREATE TRIGGER tools_bump_insert_delete AFTER INSERT OR DELETE ON tools
    FOR EACH ROW EXECUTE FUNCTION tools_bump_connector();
CREATE TRIGGER tools_bump_update AFTER UPDATE ON tools
    FOR EACH ROW WHEN ((OLD.description, OLD.input_schema, OLD.annotations, OLD.enabled, OLD.requires_approval, OLD.listed)
                       IS DISTINCT FROM
                       (NEW.description, NEW.input_schema, NEW.annotations, NEW.enabled, NEW.requires_approval, NEW.listed))
    EXECUTE FUNCTION tools_bump_connector();

---- create above / drop below ----

DROP TRIGGER tools_bump_update ON tools;
DROP TRIGGER tools_bump_insert_delete ON tools;
DROP FUNCTION tools_bump_connector();
DROP TRIGGER connectors_notify_update ON connectors;
DROP TRIGGER connectors_notify_insert_delete ON connectors;
DROP FUNCTION connectors_notify_change();
DROP TRIGGER connectors_bump_version ON connectors;
DROP FUNCTION connectors_bump_version();
ALTER TABLE connectors DROP COLUMN version_xact, DROP COLUMN config_version;
