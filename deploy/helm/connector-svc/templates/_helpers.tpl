{{/* The chart name, or nameOverride. */}}
{{- define "connector-svc.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The full name of the release's objects: fullnameOverride, or release-chart (the release alone when it
contains the chart name). Cut to 54 so that "-headless" and "-metrics" still fit 63. */}}
{{- define "connector-svc.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 54 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 54 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 54 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "connector-svc.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "connector-svc.labels" -}}
helm.sh/chart: {{ include "connector-svc.chart" . }}
{{ include "connector-svc.selectorLabels" . }}
app.kubernetes.io/version: {{ include "connector-svc.imageTag" . | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: connector-svc
{{- end -}}

{{/* Labels that select the release's pods: Services, the PDB, the NetworkPolicy, topology spread. */}}
{{- define "connector-svc.selectorLabels" -}}
app.kubernetes.io/name: {{ include "connector-svc.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: server
{{- end -}}

{{- define "connector-svc.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "connector-svc.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "connector-svc.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag -}}
{{- end -}}

{{/* repository:tag, or repository@digest when a digest is set. The repository is required: no image is
published yet. */}}
{{- define "connector-svc.image" -}}
{{- $repo := required "image.repository is required: no connector-svc image is published yet. Build the image and push it to your registry (make image-push KO_DOCKER_REPO=registry.example.com/connector-svc, see the README's \"Run it in Docker\"), then set image.repository=registry.example.com/connector-svc and image.tag or image.digest to what you pushed" .Values.image.repository -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repo .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (include "connector-svc.imageTag" .) -}}
{{- end -}}
{{- end -}}

{{/* "true" when the preStop hook runs `connector-svc sleep N` in the container: preStop.exec, or a cluster before Kubernetes
1.30, where the native sleep action is off (alpha behind a feature gate in 1.29, on by default from 1.30). */}}
{{- define "connector-svc.preStopExec" -}}
{{- if or .Values.preStop.exec (semverCompare "<1.30.0-0" .Capabilities.KubeVersion.Version) -}}true{{- end -}}
{{- end -}}

{{/* The Secret a secret setting comes from: its existingSecret, or the release's Secret. */}}
{{- define "connector-svc.secretName" -}}
{{- default (include "connector-svc.fullname" .root) .existingSecret -}}
{{- end -}}

{{/* The stdio kill grace: a stdio server gets this long after SHUTDOWN_GRACE before its process group is
killed (internal/registry CloseGrace). */}}
{{- define "connector-svc.stdioKillGraceSeconds" -}}2{{- end -}}

{{/* The least terminationGracePeriodSeconds: preStop + SHUTDOWN_DELAY + SHUTDOWN_GRACE + the stdio kill grace. */}}
{{- define "connector-svc.minTerminationGrace" -}}
{{- $pre := int .Values.preStop.sleepSeconds -}}
{{- add $pre (int .Values.shutdownDelaySeconds) (int .Values.shutdownGraceSeconds) (int (include "connector-svc.stdioKillGraceSeconds" .)) -}}
{{- end -}}

{{/* terminationGracePeriodSeconds: the value set, checked against the least, or the least plus 8 s for leaving
the cluster and flushing metrics. */}}
{{- define "connector-svc.terminationGrace" -}}
{{- $min := int (include "connector-svc.minTerminationGrace" .) -}}
{{- $set := .Values.terminationGracePeriodSeconds -}}
{{- if kindIs "invalid" $set -}}
{{- add $min 8 -}}
{{- else if lt (int $set) $min -}}
{{- fail (printf "terminationGracePeriodSeconds=%d is too short: it must be at least preStop.sleepSeconds (%d) + shutdownDelaySeconds (%d) + shutdownGraceSeconds (%d) + the stdio kill grace (%s) = %d, or the kubelet kills the pod while it drains; raise it or leave it empty to have it computed" (int $set) (int .Values.preStop.sleepSeconds) (int .Values.shutdownDelaySeconds) (int .Values.shutdownGraceSeconds) (include "connector-svc.stdioKillGraceSeconds" .) $min) -}}
{{- else -}}
{{- int $set -}}
{{- end -}}
{{- end -}}

{{/* Settings the chart sets itself, or that are secrets: never in .Values.config. */}}
{{- define "connector-svc.reservedSettings" -}}
{{- list "GRPC_ADDR" "ADMIN_ADDR" "ADMIN_ANY_ADDRESS" "INTERNAL_ADDR" "INTERNAL_ADVERTISE_ADDR" "INTERNAL_TLS_CERT_FILE" "INTERNAL_TLS_KEY_FILE" "INTERNAL_TLS_CA_FILE" "INTERNAL_TLS_SERVER_NAME" "REPLICA_ID" "AUTH" "SHUTDOWN_GRACE" "SHUTDOWN_DELAY" "TLS_CERT_FILE" "TLS_KEY_FILE" "TLS_CLIENT_CA_FILE" "LLM_BASE_URL" "LLM_MODEL" "OAUTH_REDIRECT_URL" "OAUTH_CALLBACK_ADDR" "OAUTH_CALLBACK_TLS_CERT_FILE" "OAUTH_CALLBACK_TLS_KEY_FILE" "OAUTH_CLIENT_METADATA_URL" "OAUTH_RETURN_TO_ALLOWED" "OAUTH_CALLBACK_TRUSTED_PROXIES" "MCP_ADDR" "MCP_ALLOWED_ORIGINS" "MCP_MAX_BODY_BYTES" "MCP_RATE_LIMIT" "MCP_RATE_BURST" "SECRET_KEY" "DATABASE_URL" "LLM_API_KEY" | toJson -}}
{{- end -}}

{{/* The value that sets each setting the chart owns, for the message that refuses it in config. */}}
{{- define "connector-svc.settingValueNames" -}}
{{- dict "GRPC_ADDR" "ports.grpc" "ADMIN_ADDR" "ports.admin" "INTERNAL_ADDR" "ports.internal" "INTERNAL_TLS_CERT_FILE" "internalTLS" "INTERNAL_TLS_KEY_FILE" "internalTLS" "INTERNAL_TLS_CA_FILE" "internalTLS" "INTERNAL_TLS_SERVER_NAME" "internalTLS.serverName" "AUTH" "auth" "SHUTDOWN_GRACE" "shutdownGraceSeconds" "SHUTDOWN_DELAY" "shutdownDelaySeconds" "TLS_CERT_FILE" "tls.existingSecret" "TLS_KEY_FILE" "tls.existingSecret" "TLS_CLIENT_CA_FILE" "tls.clientCA" "LLM_BASE_URL" "llm.baseURL" "LLM_MODEL" "llm.model" "OAUTH_REDIRECT_URL" "oauth.redirectURL" "OAUTH_CALLBACK_ADDR" "ports.oauth" "OAUTH_CALLBACK_TLS_CERT_FILE" "oauth.tls.secretName" "OAUTH_CALLBACK_TLS_KEY_FILE" "oauth.tls.secretName" "OAUTH_CLIENT_METADATA_URL" "oauth.clientMetadataURL" "OAUTH_RETURN_TO_ALLOWED" "oauth.returnToAllowed" "OAUTH_CALLBACK_TRUSTED_PROXIES" "oauth.trustedProxies" "MCP_ADDR" "mcp.enabled and ports.mcp" "MCP_ALLOWED_ORIGINS" "mcp.allowedOrigins" "MCP_MAX_BODY_BYTES" "mcp.maxBodyBytes" "MCP_RATE_LIMIT" "mcp.rateLimit" "MCP_RATE_BURST" "mcp.rateBurst" | toJson -}}
{{- end -}}

{{/* Fails on a config key the chart owns or that is a secret; the schema says the same for `helm install`,
this says it for every path (--set on a schema-less fork, say). */}}
{{- define "connector-svc.checkConfig" -}}
{{- $reserved := include "connector-svc.reservedSettings" . | fromJsonArray -}}
{{- range $k, $v := .Values.config -}}
{{- if has $k (list "SECRET_KEY" "DATABASE_URL" "LLM_API_KEY") -}}
{{- fail (printf "config.%s: a secret never goes in values or the ConfigMap; put it in a Secret and name it in %s" $k (get (dict "SECRET_KEY" "secretKey.existingSecret" "DATABASE_URL" "databaseURL.existingSecret" "LLM_API_KEY" "llm.apiKey.existingSecret") $k)) -}}
{{- else if has $k $reserved -}}
{{- $value := get (include "connector-svc.settingValueNames" $ | fromJson) $k -}}
{{- fail (printf "config.%s: the chart sets %s itself (see values.yaml); use its own value%s instead" $k $k (ternary (printf " %s" $value) "" (ne $value ""))) -}}
{{- end -}}
{{- end -}}
{{- range .Values.extraEnv -}}
{{- if has .name $reserved -}}
{{- fail (printf "extraEnv %s: the chart sets %s itself (see values.yaml); a second one would silently win" .name .name) -}}
{{- end -}}
{{- end -}}
{{- include "connector-svc.checkOAuth" . -}}
{{- include "connector-svc.checkMCP" . -}}
{{- end -}}

{{/* "true" when the internal hop between replicas is mutual TLS: internalTLS.enabled, or, when that is auto,
tls.enabled. */}}
{{- define "connector-svc.internalTLS" -}}
{{- if eq (toString .Values.internalTLS.enabled) "auto" -}}
{{- if .Values.tls.enabled -}}true{{- end -}}
{{- else if .Values.internalTLS.enabled -}}true{{- end -}}
{{- end -}}

{{/* "true" when the pods serve the OAuth callback: a redirect URL, and oauth.serveCallback. */}}
{{- define "connector-svc.oauthCallback" -}}
{{- if and .Values.oauth.redirectURL .Values.oauth.serveCallback -}}true{{- end -}}
{{- end -}}

{{/* Fails on OAuth values that cannot work together; the binary would refuse most of them at start-up, in a pod
in CrashLoopBackOff. */}}
{{- define "connector-svc.checkOAuth" -}}
{{- $o := .Values.oauth -}}
{{- $off := "the callback listener is off (oauth.redirectURL is empty or oauth.serveCallback false)" -}}
{{- with .Values.config.OAUTH_STATE_TTL -}}
{{- /* The duration in seconds, as Go's time.ParseDuration adds up its parts (the schema checked the form). */ -}}
{{- $unit := dict "ns" 1e-9 "us" 1e-6 "µs" 1e-6 "ms" 1e-3 "s" 1.0 "m" 60.0 "h" 3600.0 -}}
{{- $seconds := 0.0 -}}
{{- range regexFindAll "[0-9.]+(ns|us|µs|ms|s|m|h)" (toString .) -1 -}}
{{- $n := regexFind "^[0-9.]+" . -}}
{{- $seconds = addf $seconds (mulf (float64 $n) (get $unit (trimPrefix $n .))) -}}
{{- end -}}
{{- if le $seconds 0.0 -}}
{{- fail (printf "config.OAUTH_STATE_TTL=%s: want a positive duration such as 10m" .) -}}
{{- else if gt $seconds 86400.0 -}}
{{- fail (printf "config.OAUTH_STATE_TTL=%s: at most 24h; an authorization URL is meant to be used at once" .) -}}
{{- end -}}
{{- end -}}
{{- if and $o.clientMetadataURL (not $o.redirectURL) -}}
{{- fail "oauth.clientMetadataURL needs oauth.redirectURL: the document lists the redirect URL" -}}
{{- end -}}
{{- if not (include "connector-svc.oauthCallback" .) -}}
{{- if $o.clientMetadataURL -}}
{{- fail (printf "oauth.clientMetadataURL: %s, and that listener serves the document" $off) -}}
{{- end -}}
{{- if $o.tls.secretName -}}
{{- fail (printf "oauth.tls.secretName: %s; the certificate is that listener's" $off) -}}
{{- end -}}
{{- if $o.ingress.enabled -}}
{{- fail (printf "oauth.ingress.enabled: %s; the Ingress routes to it" $off) -}}
{{- end -}}
{{- else -}}
{{- range $name := list "grpc" "internal" "admin" -}}
{{- if eq (int (get $.Values.ports $name)) (int $.Values.ports.oauth) -}}
{{- fail (printf "ports.oauth=%d is ports.%s too: the callback listener needs a port of its own" (int $.Values.ports.oauth) $name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Fails on an MCP endpoint the service would refuse at start-up (cmd/connector-svc/mcp.go), in a pod in
CrashLoopBackOff: MCP_ADDR on every interface needs TLS (the gRPC TLS_* files) and API keys, unless AUTH is
none-any-address. The chart's auth is keys or none-any-address, so that is: auth=keys needs tls.enabled. */}}
{{- define "connector-svc.checkMCP" -}}
{{- if .Values.mcp.enabled -}}
{{- if and (ne .Values.auth "none-any-address") (not .Values.tls.enabled) -}}
{{- fail (printf "mcp.enabled: every pod would serve the MCP endpoint on all its interfaces (MCP_ADDR=0.0.0.0:%d), and connector-svc refuses that without TLS while callers need API keys (auth=%s): set tls.enabled=true and tls.existingSecret=<a kubernetes.io/tls Secret> (the MCP endpoint serves the gRPC certificate), or auth=none-any-address if something in front of the pods authenticates callers" (int .Values.ports.mcp) .Values.auth) -}}
{{- end -}}
{{- $others := list "grpc" "internal" "admin" -}}
{{- if include "connector-svc.oauthCallback" . -}}
{{- $others = append $others "oauth" -}}
{{- end -}}
{{- range $name := $others -}}
{{- if eq (int (get $.Values.ports $name)) (int $.Values.ports.mcp) -}}
{{- fail (printf "ports.mcp=%d is ports.%s too: the MCP endpoint needs a port of its own" (int $.Values.ports.mcp) $name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The release's pod template checksum inputs: a changed ConfigMap rolls the pods. */}}
{{- define "connector-svc.configData" -}}
{{- range $k, $v := .Values.config }}
{{ $k }}: {{ include "connector-svc.settingValue" $v | quote }}
{{- end }}
{{- with .Values.llm.baseURL }}
LLM_BASE_URL: {{ . | quote }}
{{- end }}
{{- with .Values.llm.model }}
LLM_MODEL: {{ . | quote }}
{{- end }}
{{- with .Values.oauth.redirectURL }}
OAUTH_REDIRECT_URL: {{ . | quote }}
{{- end }}
{{- with .Values.oauth.clientMetadataURL }}
OAUTH_CLIENT_METADATA_URL: {{ . | quote }}
{{- end }}
{{- with .Values.oauth.returnToAllowed }}
OAUTH_RETURN_TO_ALLOWED: {{ join "," . | quote }}
{{- end }}
{{- with .Values.oauth.trustedProxies }}
OAUTH_CALLBACK_TRUSTED_PROXIES: {{ join "," . | quote }}
{{- end }}
{{- if .Values.mcp.enabled }}
{{- with .Values.mcp.allowedOrigins }}
MCP_ALLOWED_ORIGINS: {{ join "," . | quote }}
{{- end }}
MCP_MAX_BODY_BYTES: {{ include "connector-svc.settingValue" .Values.mcp.maxBodyBytes | quote }}
MCP_RATE_LIMIT: {{ include "connector-svc.settingValue" .Values.mcp.rateLimit | quote }}
MCP_RATE_BURST: {{ include "connector-svc.settingValue" .Values.mcp.rateBurst | quote }}
{{- end }}
{{- end -}}

{{/* A setting's value as the binary reads it: YAML numbers arrive as float64 (3145728, not 3.145728e+06). */}}
{{- define "connector-svc.settingValue" -}}
{{- if and (kindIs "float64" .) (eq (float64 (int64 .)) .) -}}
{{- int64 . -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}

{{/* An HTTP probe of the admin listener, every timing from values. */}}
{{- define "connector-svc.probe" -}}
httpGet:
  path: {{ .path }}
  port: admin
  scheme: HTTP
initialDelaySeconds: {{ .initialDelaySeconds }}
periodSeconds: {{ .periodSeconds }}
timeoutSeconds: {{ .timeoutSeconds }}
failureThreshold: {{ .failureThreshold }}
successThreshold: {{ .successThreshold }}
{{- end -}}
